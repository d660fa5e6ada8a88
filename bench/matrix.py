#!/usr/bin/env python
"""The class matrix (issue 41 point 1): each model class served by mlxd and by each peer in turn,
the same load on each, one JSON per (class, server) and one markdown table.

    python bench/matrix.py --out OUT [--classes dense,hybrid,sliding,moe,vision]
        [--servers mlxd,vllm-mlx,rapid-mlx,mlx-vlm,mlx_lm.server] [--server-s 100] [--tiny]

Per class the model is made once (random weights at the class's real shape: dense Qwen3-0.6B,
hybrid Qwen3.5-0.8B, sliding-window Gemma-3-1B in bf16, MoE Qwen3-30B-A3B in 4 bits; ``--tiny``:
the same layer patterns at small widths, for a CPU check; vision: the Qwen3.5-0.8B VLM, issue
39's comparison). Per server, through HTTP with ``mlxd bench run``:

  ready     seconds from the launch until its health path answers
  first     one long prompt (--long-tokens) right after, TTFT: kernels not yet built
  warm      another prompt of the same length (no prefix-cache hit), TTFT
  streams   --levels streams of --prompt-tokens in / --max-tokens out, from --client-procs
            processes; failed requests counted, not fatal
  prefix    a shared system prompt (--prefix-tokens) cold, then hit: TTFT of each

The vision class runs two legs, as chat for every server: streams whose requests each carry an
image of their own (--image-size pixels a side) before the text, then one image cold vs cached
(three runs each). mlx_lm.server is not started for it (NOT_RUN says why).

A server that does not come up, or dies during a leg, is recorded as such and the matrix goes
on. Each server has --server-s seconds for all of it (legs cut at the bound keep what they
finished), and the run stops starting servers when --budget-s is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402  (bench/ is on the path of a script run)

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("dense", "hybrid", "sliding", "moe", "vision")
# A level's requests are at least this many (more streams: one each): one stream's figure from 4
# requests in turn spread 91-109 tok/s between starts (run SL1), and one request alone (M1) more.
ONE_STREAM_REQUESTS = 8
# make_shaped.py's shapes; dense comes from `mlxd make-model`.
SHAPES = {
    "hybrid": "qwen3_5-0.8b",
    "sliding": "gemma3-1b",
    "moe": "qwen3_moe-30b-a3b",
    "vision": "qwen3_5-0.8b-vl",
}
# Pairs not run, and why (what a CPU probe of the same versions answered).
NOT_RUN = {
    ("vision", "mlx_lm.server"): "refuses images: mlx-lm 0.32.2's server takes them only for a "
    "model with its own processor (Muse Spark); a Qwen3.5 VLM's image part gets 404 \"Only "
    "'text' content type is supported.\"",
}


def main() -> int:
    args = _parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.table_only:
        return _write_table(args.out)
    deadline = time.monotonic() + args.budget_s
    opts = _start_options(args)
    if args.make_only:
        for cls in args.classes:
            make_model(cls, args)
        return 0
    for cls in args.classes:
        model = make_model(cls, args)
        for k, name in enumerate(args.servers):
            if (cls, name) in NOT_RUN:
                _record(args, not_run(cls, name))
                continue
            left = deadline - time.monotonic() - 15 * (len(args.servers) - k)  # each one's stop
            if left < 30:
                print(f"budget spent: {cls} {name} not run", flush=True)
                continue
            bound = min(args.server_s, left / (len(args.servers) - k))  # a fair share of it
            vision = replace(opts, vision=cls == "vision")
            _record(args, run_server(cls, peers.SPECS[name], model, vision, args, bound))
    return _write_table(args.out)


def _record(args: argparse.Namespace, result: dict[str, Any]) -> None:
    path = args.out / f"matrix-{result['class']}-{result['server']}.json"
    path.write_text(json.dumps(result, indent=1))
    print(_line(result), flush=True)


def not_run(cls: str, name: str) -> dict[str, Any]:
    """The record of a pair the matrix does not start: why, in its note."""
    result: dict[str, Any] = {"class": cls, "server": name, "legs": {}, "version": ""}
    result["failed"] = NOT_RUN[(cls, name)]
    result["summary"] = summarize(result)
    return result


def make_model(cls: str, args: argparse.Namespace) -> str:
    """The class's model directory under --models, made once."""
    out = args.models / f"matrix-{cls}{'-tiny' if args.tiny else ''}"
    if (out / "config.json").exists():
        return str(out)
    t0 = time.monotonic()
    cmd = _make_command(cls, out, args.tiny)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(_make_path(cls, args))}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    print(f"made {cls} in {time.monotonic() - t0:.0f} s: {out}", flush=True)
    return str(out)


def _make_path(cls: str, args: argparse.Namespace) -> list[str]:
    """The maker's PYTHONPATH: the checkout, and mlx-vlm's peer folder for the VLM."""
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return path + ([str(args.peers_root / "mlx-vlm")] if cls == "vision" else [])


def _make_command(cls: str, out: Path, tiny: bool) -> list[str]:
    if cls == "dense":
        size = "tiny" if tiny else "qwen3-0.6b"
        return [
            sys.executable,
            "-m",
            "mlxd",
            "make-model",
            "--size",
            size,
            "--dtype",
            "bfloat16",
        ] + ["--out", str(out), "--force"]
    cmd = [sys.executable, str(ROOT / "bench" / "make_shaped.py"), SHAPES[cls], str(out)]
    cmd += ["--tiny"] if tiny else []
    return cmd + (["--quantize", "4"] if cls == "moe" else [])


def _start_options(args: argparse.Namespace) -> peers.StartOptions:
    extra = {"mlxd": args.mlxd_args.split()} if args.mlxd_args else {}
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return peers.StartOptions(args.python, path, args.peers_root, args.max_seqs, extra)


@dataclass
class Leg:
    """One `mlxd bench run` against a running server."""

    name: str
    options: list[str]
    cap_s: float  # the most this leg may take, before the server's own bound


def legs(args: argparse.Namespace, cls: str) -> list[Leg]:
    """The legs of a class. A VLM's: streams of image + text chat requests (one image each, of
    its own), then one image cold vs cached (TTFT)."""
    if cls == "vision":
        return _vision_legs(args)
    long = ["--concurrency", "1", "--prompt-tokens", str(args.long_tokens), "--max-tokens", "8"]
    long += ["--warmup-tokens", "0"]
    streams = ["--concurrency", args.levels, "--prompt-tokens", str(args.prompt_tokens)]
    streams += ["--max-tokens", str(args.max_tokens), "--client-procs", str(args.client_procs)]
    streams += ["--requests-per-level", str(ONE_STREAM_REQUESTS)]
    prefix = ["--scenario", "shared-prefix", "--prefix-tokens", str(args.prefix_tokens)]
    prefix += ["--concurrency", "1", "--max-tokens", "16"]
    return [
        Leg("first", [*long, "--seed", "101"], 120),
        Leg("warm", [*long, "--seed", "202"], 60),
        Leg("streams", streams, 400),
        Leg("prefix", prefix, 90),
    ]


def _vision_legs(args: argparse.Namespace) -> list[Leg]:
    image = ["--image-size", str(args.image_size)]
    streams = ["--concurrency", args.levels, "--prompt-tokens", str(args.prompt_tokens), *image]
    streams += ["--max-tokens", str(args.max_tokens), "--client-procs", str(args.client_procs)]
    streams += ["--requests-per-level", str(ONE_STREAM_REQUESTS)]
    repeat = ["--scenario", "shared-image", *image, "--concurrency", "1", "--max-tokens", "16"]
    repeat += ["--prompt-tokens", str(args.prompt_tokens), "--runs", "3"]
    return [Leg("streams", streams, 400), Leg("prefix", repeat, 90)]


def run_server(
    cls: str,
    spec: peers.Server,
    model: str,
    opts: peers.StartOptions,
    args: argparse.Namespace,
    bound_s: float,
) -> dict[str, Any]:
    """Start ``spec`` on ``model``, run the legs within ``bound_s``, stop it: the record."""
    until = time.monotonic() + bound_s
    log = args.out / f"server-{cls}-{spec.name}.log"
    env = peers.peer_env(spec, opts.python_path, opts.peers_root, Path("/tmp"), opts.vision)
    result: dict[str, Any] = {"class": cls, "server": spec.name, "model": model, "bound_s": bound_s}
    result["version"] = peers.version(spec, opts.python, env)
    server = peers.start(spec, model, _port(args, cls, spec), opts, log)
    result["ready_s"] = peers.wait_ready(server, min(args.ready_s, until - time.monotonic()))
    result["legs"] = {}
    if result["ready_s"] is None:
        result["failed"] = "did not start" if not server.alive() else "not ready in time"
    else:
        _run_legs(server, model, args, until, result, cls)
    result["exit_code"] = peers.stop(server)
    if result.get("failed"):
        result["log_tail"] = peers.log_tail(log)
    result["summary"] = summarize(result)
    return result


def _port(args: argparse.Namespace, cls: str, spec: peers.Server) -> int:
    """A port per (class, server): one left in TIME_WAIT is not asked for again."""
    return args.port + 10 * CLASSES.index(cls) + peers.SERVERS.index(spec.name)


def _run_legs(
    server: peers.Running,
    model: str,
    args: argparse.Namespace,
    until: float,
    out: dict[str, Any],
    cls: str,
) -> None:
    for leg in legs(args, cls):
        left = until - time.monotonic()
        if left < 5:
            out["legs"][leg.name] = {"skipped": "server bound spent"}
            continue
        bound = min(leg.cap_s, left)
        out["legs"][leg.name] = bench_leg(server, model, leg, bound, args, cls == "vision")
        if not server.alive():
            out["failed"] = f"crashed during {leg.name} (exit {server.proc.returncode})"
            return


def bench_leg(
    server: peers.Running,
    model: str,
    leg: Leg,
    bound_s: float,
    args: argparse.Namespace,
    chat: bool = False,
) -> dict[str, Any]:
    """One leg as a child `mlxd bench run`; SIGINT at the bound keeps the levels it finished."""
    json_path = args.out / f".leg-{server.spec.name}-{leg.name}.json"
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "mlxd", "bench", "run", *_target(server, model, chat)]
    cmd += leg.options
    cmd += ["--timeout", str(max(5, int(bound_s))), "--json", str(json_path)]
    t0 = time.monotonic()
    rc = _run_bounded(cmd, bound_s, args.out / f"bench-{server.spec.name}.txt")
    record: dict[str, Any] = {"rc": rc, "seconds": round(time.monotonic() - t0, 1)}
    if json_path.exists():
        record["rows"] = json.loads(json_path.read_text()).get("rows", [])
        json_path.unlink()
    return record


def _target(server: peers.Running, model: str, chat: bool) -> list[str]:
    """Where a leg's requests go; ``chat``: every server as chat, with text prompts (images
    go in chat messages)."""
    spec = server.spec
    endpoint = "chat" if chat else spec.endpoint
    out = ["--url", server.url, "--model", spec.model_name(model), "--endpoint", endpoint]
    return out + (["--text-prompts-from", model] if spec.text_prompts or chat else [])


def _run_bounded(cmd: list[str], bound_s: float, log: Path) -> int | str:
    """``cmd`` for at most ``bound_s``, then SIGINT (the bench keeps what it wrote), then kill."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(2)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return "cut at the bound"


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The table's numbers out of the legs' rows."""
    legs_ = result.get("legs", {})
    s: dict[str, Any] = {"ready_s": result.get("ready_s"), "failed": result.get("failed")}
    s["cut"] = [n for n, leg in legs_.items() if isinstance(leg.get("rc"), str) or "skipped" in leg]
    for name in ("first", "warm"):
        rows = legs_.get(name, {}).get("rows") or []
        s[f"{name}_ttft_ms"] = rows[0]["ttft_p50_ms"] if rows and rows[0].get("ok") else None
    for row in legs_.get("streams", {}).get("rows") or []:
        s[f"c{row['concurrency']}"] = {
            "tok_s": row["output_tok_s"],
            "failed": row["failed"],
            "ttft_p50_ms": row.get("ttft_p50_ms"),
            "ttft_p99_ms": row.get("ttft_p99_ms"),
        }
    for row in legs_.get("prefix", {}).get("rows") or []:
        if row.get("group") in ("cold", "hit") and row.get("ok"):
            s[f"prefix_{row['group']}_ms"] = row["ttft_p50_ms"]
    return s


def _line(result: dict[str, Any]) -> str:
    s = result["summary"]
    levels = {k: v for k, v in s.items() if k.startswith("c") and isinstance(v, dict)}
    tps = " ".join(
        f"{k}={v['tok_s']:.0f}" + (f"({v['failed']} failed)" if v["failed"] else "")
        for k, v in levels.items()
    )
    return (
        f"{result['class']:8} {result['server']:14} {result.get('version', '')}: "
        f"ready {_num(s['ready_s'], 1)} s, first/warm TTFT {_num(s['first_ttft_ms'])}/"
        f"{_num(s['warm_ttft_ms'])} ms, {tps} tok/s, prefix cold/hit "
        f"{_num(s.get('prefix_cold_ms'))}/{_num(s.get('prefix_hit_ms'))} ms"
        + (f" FAILED: {s['failed']}" if s["failed"] else "")
    )


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table for docs/PERFORMANCE.md: one row per (class, server)."""
    levels = sorted(
        {k for r in results for k in r["summary"] if k[:1] == "c" and k[1:].isdigit()},
        key=lambda k: int(k[1:]),
    )
    head = ["class", "server", "ready s", "first / warm TTFT ms"]
    head += [f"{k} tok/s (TTFT p50/p99 ms)" for k in levels]
    head += ["prefix (vision: image) cold / hit TTFT ms", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    order = {c: i for i, c in enumerate(CLASSES)}
    for r in sorted(
        results, key=lambda r: (order.get(r["class"], 9), peers.SERVERS.index(r["server"]))
    ):
        lines.append("| " + " | ".join(_cells(r, levels)) + " |")
    return "\n".join(lines) + "\n"


def _cells(r: dict[str, Any], levels: list[str]) -> list[str]:
    s = r["summary"]
    cells = [r["class"], f"{r['server']} {r.get('version', '')}", _num(s["ready_s"], 1)]
    cells.append(f"{_num(s['first_ttft_ms'])} / {_num(s['warm_ttft_ms'])}")
    for k in levels:
        v = s.get(k)
        cells.append("–" if v is None else _level_cell(v))
    cells.append(f"{_num(s.get('prefix_cold_ms'))} / {_num(s.get('prefix_hit_ms'))}")
    cut = "cut at the bound: " + ", ".join(s["cut"]) if s.get("cut") else ""
    return cells + ["; ".join(n for n in (s["failed"], cut) if n)]


def _level_cell(v: dict[str, Any]) -> str:
    """tok/s, TTFT p50/p99 and failures of one level."""
    ttft = f" ({_num(v.get('ttft_p50_ms'))}/{_num(v.get('ttft_p99_ms'))})"
    return f"{v['tok_s']:,.0f}" + ttft + (f", {v['failed']} failed" if v["failed"] else "")


def _num(v: float | None, digits: int = 0) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _write_table(out: Path) -> int:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("matrix-*.json"))]
    (out / "matrix.md").write_text(table(results))
    print((out / "matrix.md").read_text())
    plot(results, out / "matrix.png")
    return 0


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """tok/s by level, one panel per class, a bar per server (needs matplotlib; else no plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    classes = [c for c in CLASSES if any(r["class"] == c for r in results)]
    if not classes:
        return
    fig, axes = plt.subplots(1, len(classes), figsize=(4.5 * len(classes), 3.8), squeeze=False)
    for ax, cls in zip(axes[0], classes, strict=True):
        _bars(ax, [r for r in results if r["class"] == cls])
        ax.set_title(cls)
    axes[0][0].set_ylabel("output tok/s")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _bars(ax: Any, rows: list[dict[str, Any]]) -> None:
    rows = sorted(rows, key=lambda r: peers.SERVERS.index(r["server"]))
    levels = sorted(
        {k for r in rows for k in r["summary"] if _is_level(k)}, key=lambda k: int(k[1:])
    )
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        heights = [(r["summary"].get(k) or {}).get("tok_s", 0) for k in levels]
        ax.bar([j + i * width for j in range(len(levels))], heights, width, label=r["server"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], levels)


def _is_level(key: str) -> bool:
    return key[:1] == "c" and key[1:].isdigit()


def rotated(servers: list[str], by: int) -> list[str]:
    """``servers`` started ``by`` places in: a class's repeated passes alternate who runs first
    (run SL1 alternated by hand)."""
    k = by % len(servers) if servers else 0
    return servers[k:] + servers[:k]


def _parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--classes", default=env("CLASSES", ",".join(CLASSES)))
    p.add_argument("--servers", default=env("SERVERS", ",".join(peers.SERVERS)))
    p.add_argument("--models", type=Path, default=Path(env("MODELS", "/root/models")))
    p.add_argument("--peers-root", type=Path, default=Path(env("PEERS_ROOT", "/root/peers")))
    p.add_argument("--python", default=env("PYTHON", sys.executable), help="the servers' Python")
    p.add_argument("--tiny", action="store_true", help="tiny widths (a CPU check)")
    p.add_argument("--make-only", action="store_true", help="only make the models")
    p.add_argument("--table-only", action="store_true", help="only the table from --out's JSON")
    p.add_argument("--server-s", type=float, default=float(env("SERVER_S", "100")))
    p.add_argument("--ready-s", type=float, default=float(env("READY_S", "90")))
    p.add_argument("--budget-s", type=float, default=float(env("BUDGET_S", "100000")))
    p.add_argument("--levels", default=env("LEVELS", "1,16,64"))
    p.add_argument("--prompt-tokens", type=int, default=int(env("PROMPT", "128")))
    p.add_argument("--max-tokens", type=int, default=int(env("OUTPUT", "128")))
    p.add_argument("--long-tokens", type=int, default=int(env("LONG", "4500")))
    p.add_argument("--prefix-tokens", type=int, default=int(env("PREFIX", "2000")))
    p.add_argument("--image-size", type=int, default=int(env("IMAGE", "448")), help="vision")
    p.add_argument("--client-procs", type=int, default=int(env("CLIENT_PROCS", "8")))
    p.add_argument("--max-seqs", type=int, default=int(env("MAX_SEQS", "128")))
    p.add_argument("--mlxd-args", default=env("MLXD_ARGS", ""), help="more `mlxd start` options")
    p.add_argument("--port", type=int, default=int(env("PORT", "8400")))
    p.add_argument("--rotate", type=int, default=0, help="start the servers' order this far in")
    args = p.parse_args()
    args.classes = [c for c in args.classes.split(",") if c]
    args.servers = rotated([s for s in args.servers.split(",") if s], args.rotate)
    bad = [c for c in args.classes if c not in CLASSES] + [
        s for s in args.servers if s not in peers.SPECS
    ]
    if bad:
        p.error(f"unknown class or server: {bad}")
    return args


if __name__ == "__main__":
    sys.exit(main())
