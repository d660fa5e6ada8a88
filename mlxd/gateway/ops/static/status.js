// mlxd status page: polls GET /admin/overview (the JSON `mlxd ps` and `mlxd status` read too)
// and draws it. No framework, no build step. Keys typed here live in sessionStorage only: this
// tab, until it closes. Everything from the server goes in through textContent, never as HTML.
"use strict";

const POLL_MS = 1000;
const MAX_POINTS = 120; // two minutes of chart at one poll a second
const READ_KEY = "mlxd.key";
const ADMIN_KEY = "mlxd.adminKey";
const store = window.sessionStorage;
const cards = new Map(); // model name -> its card element
const series = new Map(); // model name -> {tps: [], ttft: []}
let timer = null;
let polling = false;
let pendingKey = null; // {slot, then}: what to do once the key form is submitted

// Polling

async function poll() {
  clearTimeout(timer);
  if (polling || pendingKey) return;
  polling = true;
  try {
    const r = await fetch("/admin/overview", { headers: auth(READ_KEY, ADMIN_KEY), cache: "no-store" });
    if (r.status === 401) {
      store.removeItem(READ_KEY);
      askKey(READ_KEY, "API key (or the admin key) to read this daemon's status", poll);
      return;
    }
    if (!r.ok) throw new Error(await errorText(r));
    render(await r.json());
  } catch (e) {
    notice(`cannot read the status: ${e.message}`, true);
  } finally {
    polling = false;
    if (!pendingKey) timer = setTimeout(poll, POLL_MS);
  }
}

function auth(first, second) {
  const key = store.getItem(first) || store.getItem(second);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function errorText(r) {
  try {
    return `${(await r.json()).error.message} (HTTP ${r.status})`;
  } catch {
    return `HTTP ${r.status}`;
  }
}

// Keys

function askKey(slot, label, then) {
  pendingKey = { slot, then };
  document.getElementById("key-label").textContent = label;
  const form = document.getElementById("key-form");
  form.hidden = false;
  form.querySelector("input").value = "";
  form.querySelector("input").focus();
}

function submitKey(event) {
  event.preventDefault();
  const input = document.getElementById("key-input");
  const { slot, then } = pendingKey;
  if (input.value.trim()) store.setItem(slot, input.value.trim());
  input.value = "";
  closeKeyForm();
  then();
}

function closeKeyForm() {
  pendingKey = null;
  document.getElementById("key-form").hidden = true;
  timer = setTimeout(poll, POLL_MS);
}

// Admin actions: load, unload, drain, resume

async function act(name, action) {
  const path = encodeURIComponent(name).replaceAll("%2F", "/");
  const init = { method: "POST", headers: auth(ADMIN_KEY, READ_KEY) };
  if (action === "load") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify({ wait: false }); // the page shows the load as it goes
  }
  notice(`${name}: ${action}…`);
  try {
    const r = await fetch(`/admin/models/${path}/${action}`, init);
    if (r.status === 401) {
      store.removeItem(ADMIN_KEY);
      askKey(ADMIN_KEY, `admin key to ${action} ${name}`, () => act(name, action));
      return;
    }
    if (!r.ok) throw new Error(await errorText(r));
    const body = await r.json();
    notice(`${name}: ${action} done (${body.state})`);
  } catch (e) {
    notice(`${name}: ${action} failed: ${e.message}`, true);
  }
  poll();
}

// Rendering

function render(data) {
  text("daemon", `pid ${data.pid} · v${data.version} · up ${duration(data.uptime_s)}`);
  text("updated", `updated ${new Date().toLocaleTimeString()}`);
  renderHealth(data.health);
  const mem = data.memory || {};
  text("budget", mem.max_memory_bytes
    ? `memory budget: ${bytes(mem.reserved_bytes)} reserved of ${bytes(mem.max_memory_bytes)}`
    : `memory reserved: ${bytes(mem.reserved_bytes || 0)} (no --max-memory budget)`);
  const names = new Set();
  for (const model of data.models) {
    names.add(model.name);
    renderModel(model);
  }
  for (const [name, card] of cards) {
    if (!names.has(name)) { card.remove(); cards.delete(name); series.delete(name); }
  }
  renderBackends(data.backends || []);
  renderRequests(data.recent_requests || []);
}

// Liveness (/health) and readiness (/health/ready): the same report the endpoints answer.
function renderHealth(health) {
  const el = document.getElementById("health");
  if (!health) { el.textContent = ""; return; }
  const failed = health.failed.map((f) => f.model ?? f.backend);
  el.textContent = failed.length
    ? `health: ${health.status} (not ready: ${failed.join(", ")})`
    : `health: ${health.status}`;
  el.className = health.status === "ok" ? "ok" : "bad";
}

function renderModel(model) {
  let card = cards.get(model.name);
  if (!card) {
    card = document.getElementById("model-card").content.firstElementChild.cloneNode(true);
    card.dataset.model = model.name;
    card.querySelector(".name").textContent = model.name;
    for (const button of card.querySelectorAll("[data-action]")) {
      button.addEventListener("click", () => act(model.name, button.dataset.action));
    }
    document.getElementById("models").append(card);
    cards.set(model.name, card);
  }
  const w = model.worker;
  const state = w ? w.status.state : model.state;
  const badge = card.querySelector(".state");
  badge.textContent = state;
  badge.className = `state ${state}`;
  card.dataset.state = state;
  const compute = w && w.status.compute;
  card.querySelector(".backend").textContent = [
    `${model.backend} · ${model.replicas} worker${model.replicas > 1 ? "s" : ""}`,
    compute ? `${compute.device} ${compute.dtype}${compute.blas ? ` · ${basename(compute.blas)}` : ""}` : "",
  ].filter(Boolean).join(" · ");
  card.querySelector(".reason").textContent =
    model.state === "failed" ? model.last_error : model.state === "warming" ? model.progress : "";
  figures(card.querySelector(".figures"), modelFigures(model));
  const points = series.get(model.name) || { tps: [], ttft: [] };
  series.set(model.name, points);
  push(points.tps, w ? w.stats.output_tps_recent : 0);
  push(points.ttft, w && w.stats.ttft.num_samples ? w.stats.ttft.p50_ms : null);
  chart(card.querySelector(".chart-tps"), points.tps);
  chart(card.querySelector(".chart-ttft"), points.ttft);
  card.querySelector(".tps-now").textContent = w ? w.stats.output_tps_recent.toFixed(1) : "–";
  card.querySelector(".tps-peak").textContent = `peak ${Math.max(0, ...points.tps).toFixed(1)}`;
  card.querySelector(".ttft-now").textContent = w ? ms(w.stats.ttft.p50_ms) : "–";
}

function modelFigures(model) {
  const w = model.worker;
  const rows = [
    ["pid", model.pid ?? "–"],
    ["weights", bytes(w ? w.status.memory.weights_bytes : model.weights_bytes)],
    ["KV reserved", model.kv_bytes ? bytes(model.kv_bytes) : "–"],
    ["in flight", model.in_flight],
    ["restarts", model.restarts],
    ["uptime", model.uptime_s == null ? "–" : duration(model.uptime_s)],
  ];
  // Several replicas: each one's state, what it runs and holds, and how many requests it got.
  for (const r of model.replica_rows || []) {
    rows.push([`replica ${r.index}`, `${r.state} · pid ${r.pid ?? "–"} · ` +
      `${r.num_running} running, ${r.num_waiting} waiting · ${r.routed} routed`]);
  }
  if (!w) return rows;
  const st = w.status;
  const stats = w.stats;
  const asked = stats.prefix_cache_hits + stats.prefix_cache_misses;
  return rows.concat([
    ["KV in flight", kvUsed(st, stats)],
    ["MLX active", bytes(st.memory.active_bytes)],
    ["queue", st.num_waiting],
    ["running rows", `${st.num_running + st.num_prefilling} of ${st.scheduler.max_num_seqs}`],
    ["prefix hits", asked ? `${pct(stats.prefix_cache_hits / asked)} of ${asked}` : "–"],
    ["decode step", stats.decode_step.num_samples
      ? `${ms(stats.decode_step.p50_ms)} p50 · ${ms(stats.decode_step.p95_ms)} p95` : "–"],
    ["rows/step", stats.decode_steps ? stats.decode_rows_mean.toFixed(1) : "–"],
    ["tokens out", stats.output_tokens],
  ], visionFigures(model, stats));
}

// A vision-language model's images: how many and how fast, the tower's time, its memory.
function visionFigures(model, stats) {
  if (!model.vision_weights_bytes && !stats.images) return [];
  const encoded = stats.images_encoded;
  return [
    ["images", `${stats.images} · ${stats.images_per_s_recent.toFixed(1)}/s`],
    ["encoder", `${encoded} encoded · ${stats.vision_encode_s.toFixed(2)} s` +
      (encoded ? ` · ${ms(1000 * stats.vision_encode_s / encoded)} per image` : "")],
    ["vision memory", `${bytes(model.vision_weights_bytes)} tower · ` +
      `${bytes(model.encoder_peak_bytes)} encoder peak`],
  ];
}

// Bytes held by requests in flight; the block count also holds the prefix cache's blocks.
function kvUsed(status, stats) {
  const used = bytes(status.memory.kv_bytes);
  if (!stats.kv_blocks_total) return used;
  return `${used} · blocks ${stats.kv_blocks_used}/${stats.kv_blocks_total} with prefix cache`;
}

function figures(dl, rows) {
  dl.replaceChildren(...rows.flatMap(([label, value]) => [el("dt", label), el("dd", String(value))]));
}

function renderBackends(backends) {
  if (!backends.length) return; // the page's placeholder says none are configured
  const box = document.getElementById("backends");
  box.replaceChildren(...backends.map(backendLine));
}

// One remote backend: where it is, its state and what its last failure said (never its key).
function backendLine(b) {
  const p = el("p", `${b.name} (${b.kind}, ${b.base_url}): `);
  const state = el("span", b.state);
  state.className = `state ${b.state === "failing" ? "failed" : b.state === "ok" ? "running" : ""}`;
  const counts = ` ${b.requests} requests, ${b.failures} failed`;
  const last = b.state === "failing" && b.last_error ? ` · last error: ${b.last_error}` : "";
  p.append(state, counts + last);
  return p;
}

function renderRequests(rows) {
  const body = document.querySelector("#requests tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    const cells = [
      new Date(r.time * 1000).toLocaleTimeString(), r.model ?? "–", r.endpoint, r.status,
      r.key ?? "–", r.prompt_tokens, r.completion_tokens, ms(r.ttft_ms), ms(r.e2e_ms),
    ];
    tr.append(...cells.map((c) => el("td", String(c))));
    if (r.status >= 400) tr.children[3].className = "bad";
    return tr;
  }));
}

// Charts: an SVG polyline scaled to the largest value shown

function push(values, value) {
  values.push(value);
  if (values.length > MAX_POINTS) values.shift();
}

function chart(svg, values) {
  const shown = values.filter((v) => v != null);
  const max = Math.max(0, ...shown);
  const step = 300 / (MAX_POINTS - 1);
  const offset = MAX_POINTS - values.length; // new points enter on the right
  const points = values
    .map((v, i) => (v == null ? null : `${((offset + i) * step).toFixed(1)},${(78 - (max ? v / max : 0) * 74).toFixed(1)}`))
    .filter(Boolean);
  let line = svg.querySelector("polyline");
  if (!line) {
    line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    svg.append(line);
  }
  line.setAttribute("points", points.join(" "));
  svg.dataset.max = String(max);
  svg.dataset.last = String(shown.length ? shown[shown.length - 1] : 0);
}

// Formatting

function el(tag, content) {
  const node = document.createElement(tag);
  node.textContent = content;
  return node;
}

function text(id, content) {
  document.getElementById(id).textContent = content;
}

function notice(message, isError = false) {
  const node = document.getElementById("notice");
  node.textContent = message;
  node.className = isError ? "error" : "";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

function ms(v) {
  if (v == null) return "–";
  return v < 1000 ? `${v.toFixed(0)} ms` : `${(v / 1000).toFixed(2)} s`;
}

function basename(path) {
  return path.split("/").pop();
}

function pct(x) {
  return `${(x * 100).toFixed(0)}%`;
}

function duration(s) {
  if (s < 60) return `${s.toFixed(0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.floor(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

document.getElementById("key-form").addEventListener("submit", submitKey);
document.getElementById("key-cancel").addEventListener("click", closeKeyForm);
document.getElementById("forget").addEventListener("click", () => {
  store.removeItem(READ_KEY);
  store.removeItem(ADMIN_KEY);
  notice("keys forgotten");
});
poll();
