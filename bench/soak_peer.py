#!/usr/bin/env python
"""A memory soak of one server of any kind (issue 41 point 5): mlxd or a peer (bench/peers.py)
under mixed streaming load for a duration, its memory sampled as it goes.

    python bench/soak_peer.py --server mlxd --model DIR --label mlxd-hybrid --out OUT
        [--duration 600] [--streams 32] [--gpu 0] [--sample-every 10]
    python bench/soak_peer.py --report OUT     # summary table + soak.png over OUT/soak-*.json

The load: --streams client loops, each sending chat streams one after another (every server has
/v1/chat/completions; mlx-vlm's has nothing else). A prompt is a body of one of --lengths words
(about a token each), half of them after one of --prefixes shared system prompts of
--prefix-tokens words (prefix caches fill and evict); --max-tokens drawn from 32 to
--max-output; --cancel-fraction of the streams are dropped by the client after a few chunks.
Failures (an HTTP error, a transport error, a stream cut without [DONE]) are counted, not fatal.

Every --sample-every seconds: the GPU's memory in use (nvidia-smi, the --gpu index the server
runs on) or, without a GPU, the server's process tree's RSS; that tree's RSS always; for mlxd
its worker's MLX active, peak and cache memory (/admin/overview). Growth is
the last sample against the first sample after --baseline-s (the first minute: model load and
first kernels are not growth), in %; the peak after it too.

bench/soak.py stays mlxd's own soak (two models, worker kills, the gateway's file descriptors);
this one is server-agnostic, so it keeps its load to what every server speaks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peers  # noqa: E402  (bench/ is on the path of a script run)
from soak import _children, _rss_mb  # noqa: E402

from mlxd.bench.workload import make_prompts, words  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OK = ("ok", "cancelled by client")


def main() -> int:
    args = _parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report(args.out)
    spec = peers.SPECS[args.server]
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    opts = peers.StartOptions(args.python, path, args.peers_root, args.max_seqs, _extra(args))
    log = args.out / f"server-{args.label}.log"
    server = peers.start(spec, args.model, args.port, opts, log)
    record: dict[str, Any] = {"label": args.label, "server": args.server, "model": args.model}
    record.update(gpu=args.gpu, duration_s=args.duration, streams=args.streams)
    record["ready_s"] = peers.wait_ready(server, args.ready_s)
    try:
        if record["ready_s"] is not None:
            record.update(asyncio.run(Soak(args, server).run()))
        else:
            record["failed"] = "did not start"
    finally:
        record["exit_code"] = peers.stop(server)
    if record.get("failed") or not record.get("samples"):
        record["log_tail"] = peers.log_tail(log)
    record["summary"] = growth(record.get("samples", []), args.baseline_s)
    (args.out / f"soak-{args.label}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({"label": args.label, **record["summary"], **_counts(record)}), flush=True)
    return 0


def _extra(args: argparse.Namespace) -> dict[str, list[str]]:
    return {"mlxd": args.mlxd_args.split()} if args.mlxd_args else {}


class Soak:
    """The client loops and the sampler, on one event loop."""

    def __init__(self, args: argparse.Namespace, server: peers.Running) -> None:
        self.args, self.server = args, server
        self.model = server.spec.model_name(args.model)
        self.rng = random.Random(args.seed)
        self.outcomes: Counter[str] = Counter()
        self.samples: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.deadline = self.started + args.duration
        seeds = range(1, args.prefixes + 1)
        self.prefixes = [words(make_prompts(1, args.prefix_tokens, seed=s)[0]) for s in seeds]
        self.lengths = [int(n) for n in args.lengths.split(",")]

    async def run(self) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=self.args.streams + 4)
        timeout = httpx.Timeout(self.args.request_timeout, connect=10)
        async with httpx.AsyncClient(base_url=self.server.url, timeout=timeout, limits=limits) as h:
            self.http = h
            loops = [self._client() for _ in range(self.args.streams)]
            await asyncio.gather(*loops, self._sampler())
        if not self.server.alive():
            return {**self._result(), "failed": f"exited with {self.server.proc.returncode}"}
        return self._result()

    def _result(self) -> dict[str, Any]:
        return {"outcomes": dict(self.outcomes.most_common()), "samples": self.samples}

    async def _client(self) -> None:
        while time.monotonic() < self.deadline and self.server.alive():
            outcome = await self._one()
            self.outcomes[outcome] += 1
            if outcome not in OK:
                await asyncio.sleep(0.5)  # a failing server is not hammered in a tight loop

    def _body(self) -> tuple[dict[str, Any], int | None]:
        """A chat request of a mixed length, half behind a shared prefix; when to cancel it."""
        rng = self.rng
        user = words(make_prompts(1, rng.choice(self.lengths), seed=rng.getrandbits(32))[0])
        messages = [{"role": "user", "content": user}]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": rng.choice(self.prefixes)})
        body = {"model": self.model, "messages": messages, "stream": True, "temperature": 0.7}
        body["max_tokens"] = rng.randint(32, self.args.max_output)
        cancel = rng.randint(1, 16) if rng.random() < self.args.cancel_fraction else None
        return body, cancel

    async def _one(self) -> str:
        body, cancel = self._body()
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return f"HTTP {r.status_code}"
                return await self._read(r, cancel)
        except httpx.HTTPError as exc:
            return f"transport: {type(exc).__name__}"

    async def _read(self, r: httpx.Response, cancel: int | None) -> str:
        chunks = 0
        async for line in r.aiter_lines():
            if line.strip() == "data: [DONE]":
                return "ok"
            if line.startswith('data: {"error"'):
                return "stream error"
            chunks += line.startswith("data: ")
            if cancel is not None and chunks >= cancel:
                return "cancelled by client"
        return "stream ended without [DONE]"

    async def _sampler(self) -> None:
        while True:
            self.samples.append(await asyncio.to_thread(self._sample))
            if time.monotonic() >= self.deadline or not self.server.alive():
                return
            await asyncio.sleep(self.args.sample_every)

    def _sample(self) -> dict[str, Any]:
        tree = process_tree(self.server.proc.pid)
        rss = [_rss_mb(p) for p in tree]
        s = {"t": round(time.monotonic() - self.started, 1), "requests": self.outcomes.total()}
        s["failed"] = sum(n for k, n in self.outcomes.items() if k not in OK)
        s["tree_rss_mb"] = round(sum(r for r in rss if r), 1)
        s["rss_mb"] = {str(p): r for p, r in zip(tree, rss, strict=True)}
        s["gpu_mb"] = gpu_used_mb(self.args.gpu)
        if self.server.spec.name == "mlxd":
            s["mlx_mb"] = mlxd_memory(self.server.url)
        return s


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (mlxd's gateway and its workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def mlxd_memory(url: str) -> dict[str, float]:
    """mlxd's worker's own MLX memory (active, peak, cache; MiB): what nvidia-smi cannot split."""
    try:
        models = httpx.get(f"{url}/admin/overview?fresh=1", timeout=10).json()["models"]
        memory = models[0]["worker"]["status"]["memory"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return {}
    keys = ("active_bytes", "peak_bytes", "cache_bytes")
    return {k.removesuffix("_bytes"): round(memory[k] / 2**20, 1) for k in keys if k in memory}


def gpu_used_mb(index: int | None) -> float | None:
    """Memory in use on GPU ``index`` by nvidia-smi (MiB); None without one."""
    if index is None:
        return None
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"-i={index}"]
    try:
        return float(subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def growth(samples: list[dict[str, Any]], baseline_s: float) -> dict[str, Any]:
    """Growth of the memory measure (GPU if sampled, else the tree's RSS) after ``baseline_s``."""
    if not samples:
        return {"measure": None}
    key = "gpu_mb" if samples[0].get("gpu_mb") is not None else "tree_rss_mb"
    base_s = min(baseline_s, samples[-1]["t"] / 4)  # a short check keeps three quarters
    after = [s for s in samples if s["t"] >= base_s and s.get(key) is not None]
    if not after or not after[0][key]:
        return {"measure": key}
    base, last, peak = after[0][key], after[-1][key], max(s[key] for s in after)
    out: dict[str, Any] = {"measure": key, "baseline_t": after[0]["t"], "baseline_mb": base}
    out.update(last_mb=last, peak_mb=peak, growth_pct=round(100 * (last - base) / base, 2))
    out["peak_growth_pct"] = round(100 * (peak - base) / base, 2)
    out.update(_plateau(after, key))
    out["rss_growth_pct"] = _pct([s["tree_rss_mb"] for s in after])
    out["mlx_active_growth_pct"] = _pct([s.get("mlx_mb", {}).get("active") for s in after])
    return out


def _plateau(after: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """When the measure last rose above what it had held (``grew_until_t``), and its growth
    over the run's second half (``late_growth_pct``): a memory that stops growing shows 0."""
    top, grew_until = after[0][key], after[0]["t"]
    for s in after:
        if s[key] > top:
            top, grew_until = s[key], s["t"]
    half = after[-1]["t"] / 2
    mid = next(s for s in after if s["t"] >= half or s is after[-1])
    return {"grew_until_t": grew_until, "late_growth_pct": _pct([mid[key], after[-1][key]])}


def _pct(values: list[float | None]) -> float | None:
    """Last over first, in % (None when either is missing)."""
    first, last = values[0], values[-1]
    return round(100 * (last - first) / first, 2) if first and last is not None else None


def _counts(record: dict[str, Any]) -> dict[str, Any]:
    outcomes = record.get("outcomes", {})
    failed = sum(n for k, n in outcomes.items() if k not in OK)
    return {"requests": sum(outcomes.values()), "failed": failed, "error": record.get("failed")}


def report(out: Path) -> int:
    """The summary table (soak.md) and the plot (soak.png) of every soak-*.json in ``out``."""
    records = [json.loads(p.read_text()) for p in sorted(out.glob("soak-*.json"))]
    lines = [
        "| server | measure | baseline MiB | last MiB | growth % | peak growth % | "
        "grew until s | second-half growth % | "
        "tree RSS growth % | mlxd MLX active growth % | requests | failed | cancelled | note |",
        "|" + " --- |" * 14,
    ]
    for r in records:
        lines.append(_report_row(r))
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    print((out / "soak.md").read_text())
    _plot(records, out / "soak.png")
    return 0


def _report_row(r: dict[str, Any]) -> str:
    s, c = r["summary"], _counts(r)
    if "late_growth_pct" not in s and s.get("baseline_t") is not None:  # a run from before them
        s = growth(r.get("samples", []), s["baseline_t"])
    cancelled = r.get("outcomes", {}).get("cancelled by client", 0)
    cells = [r["label"], s.get("measure") or "–"]
    cells += [_f(s.get(k)) for k in ("baseline_mb", "last_mb", "growth_pct", "peak_growth_pct")]
    cells += [_f(s.get("grew_until_t")), _f(s.get("late_growth_pct"))]
    cells += [_f(s.get("rss_growth_pct")), _f(s.get("mlx_active_growth_pct"))]
    cells += [str(c["requests"]), str(c["failed"]), str(cancelled)]
    return "| " + " | ".join([*cells, c["error"] or ""]) + " |"


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f}"


def _plot(records: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot (the JSON has every sample)")
        return
    samples = [s for r in records for s in r.get("samples", [])]
    panels = [("gpu_mb", "GPU memory used (MiB)")] if any(s.get("gpu_mb") for s in samples) else []
    panels.append(("tree_rss_mb", "server processes' RSS (MiB)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.5 * len(panels)), sharex=True)
    axes = axes if len(panels) > 1 else [axes]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for r in records:
            points = r.get("samples", [])
            ax.plot([s["t"] / 60 for s in points], [s.get(key) for s in points], label=r["label"])
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def _parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--report", action="store_true", help="only the table and plot of --out")
    p.add_argument("--server", choices=sorted(peers.SPECS), default="mlxd")
    p.add_argument("--model", default="")
    p.add_argument("--label", default="")
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--sample-every", type=float, default=10)
    p.add_argument("--baseline-s", type=float, default=60)
    p.add_argument("--gpu", type=int, default=None, help="nvidia-smi index (none: RSS only)")
    p.add_argument("--lengths", default="128,512,2048")
    p.add_argument("--prefixes", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--request-timeout", type=float, default=300)
    p.add_argument("--ready-s", type=float, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--peers-root", type=Path, default=Path(env("PEERS_ROOT", "/root/peers")))
    p.add_argument("--python", default=env("PYTHON", sys.executable))
    p.add_argument("--mlxd-args", default=env("MLXD_ARGS", ""))
    args = p.parse_args()
    args.label = args.label or args.server
    return args


if __name__ == "__main__":
    sys.exit(main())
