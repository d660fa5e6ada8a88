"""The first long prompt after a start against the same-length prompt once warm, with the
worker's warm-up at load on and off (issue 41 point 4).

Each run starts `mlxd start` on a made model (qwen3, --size tiny unless given) in a fresh data
directory with --warmup-s given or 0, waits until it serves, then times a --tokens prompt
(max_tokens 1; its time is the TTFT), then --warm more prompts of the same length that share no
prefix with it or each other (no prefix-cache hit); the ratio is the first over the median of
those. Runs alternate on and off, --runs of each (on only with --on-only); prints each run and
the medians. --model serves a model directory (a matrix class's) instead of a made qwen3; the
daemon inherits the environment (MLX_CUDA_GRAPH_CACHE_SIZE=..., MLX_USE_CUDA_GRAPHS=0: run FP2).

    .venv/bin/python bench/first_prompt.py [--size tiny | --model DIR] [--tokens 3500] [--runs 3]
        [--on-only] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kv_memory import free_port, wait  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", help="`mlxd make-model --size` of the qwen3 model")
    ap.add_argument("--tokens", type=int, default=3500)
    ap.add_argument("--warm", type=int, default=3, help="prompts timed after the first")
    ap.add_argument("--runs", type=int, default=3, help="runs of each of warm-up on and off")
    ap.add_argument("--warmup-s", type=float, default=20.0, help="the on runs' --warmup-s")
    ap.add_argument("--model", type=Path, help="serve this model directory instead")
    ap.add_argument("--on-only", action="store_true", help="no runs with warm-up off")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mlxd-first-") as tmp:
        model = args.model or _made(Path(tmp), args.size)
        for run in range(args.runs):
            for warmup_s in _order(args, run):
                rows.append(_run(model, warmup_s, args, seed=len(rows)))
                print(_line(rows[-1]), flush=True)
    summary = {
        label: statistics.median(float(r["ratio"]) for r in rows if r["warmup_s"] == w)  # type: ignore[arg-type]
        for label, w in (("on", args.warmup_s), ("off", 0.0))
        if any(r["warmup_s"] == w for r in rows)
    }
    print("median first / warm:", ", ".join(f"warm-up {k} {v:.2f}x" for k, v in summary.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "median_ratio": summary}, indent=1))


def _made(tmp: Path, size: str) -> Path:
    """A qwen3 model of ``size`` with random weights, written under ``tmp``."""
    from mlxd.models.maker import write_model
    from mlxd.models.presets import model_config

    return write_model(tmp / "m", model_config("qwen3", size), progress=print)


def _order(args: argparse.Namespace, run: int) -> tuple[float, ...]:
    """Run ``run``'s warm-up settings: on then off, alternated from run to run; on only."""
    if args.on_only:
        return (args.warmup_s,)
    return (args.warmup_s, 0.0) if run % 2 == 0 else (0.0, args.warmup_s)


def _run(model: Path, warmup_s: float, args: argparse.Namespace, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="mlxd-home-") as home:
        port = free_port()
        cmd = [sys.executable, "-m", "mlxd", "start", "--model", f"m={model}"]
        cmd += ["--port", str(port), "--log-level", "warning", "--warmup-s", str(warmup_s)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env={**os.environ, "MLXD_HOME": home})
        try:
            url = f"http://127.0.0.1:{port}"
            name = wait(url)
            start_s = time.monotonic() - t0
            rng = random.Random(seed)
            times = [_ttft(url, name, args.tokens, rng) for _ in range(1 + args.warm)]
        finally:
            proc.terminate()
            proc.wait(60)
    warm = statistics.median(times[1:])
    return {
        "warmup_s": warmup_s,
        "start_s": round(start_s, 2),
        "first_ms": round(times[0] * 1e3, 1),
        "warm_ms": round(warm * 1e3, 1),
        "ratio": round(times[0] / warm, 2),
    }


def _ttft(url: str, name: str, tokens: int, rng: random.Random) -> float:
    prompt = [rng.randrange(100, 8000) for _ in range(tokens)]  # the made vocabulary: 8,192
    body = {"model": name, "prompt": prompt, "max_tokens": 1}
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def _line(r: dict[str, object]) -> str:
    return (
        f"warm-up {r['warmup_s']:>4} s: ready after {r['start_s']} s, first {r['first_ms']} ms,"
        f" warm {r['warm_ms']} ms, ratio {r['ratio']}x"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
