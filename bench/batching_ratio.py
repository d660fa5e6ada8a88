#!/usr/bin/env python
"""What batching gains on this machine: tok/s at concurrency N over concurrency 1, three ways,
alternated ROUNDS times (medians): through the daemon over HTTP, the worker over ZeroMQ alone
(bench/bench_zmq.py, no gateway, a lean client), and the engine in-process.

    .venv/bin/python bench/batching_ratio.py MODEL [N] [ROUNDS] [MAX_TOKENS] [PROMPT_TOKENS]
    .venv/bin/python bench/batching_ratio.py /tmp/tiny 8 5 256 16

On a small CPU machine the three differ by what runs beside the model: the gateway's and the
client's CPU competes with the worker's compute thread. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from soak import free_port, wait_healthy  # noqa: E402

PY = sys.executable


def main() -> int:
    args = sys.argv[1:] + ["8", "5", "256", "16"][len(sys.argv[2:]) :]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    model, n, rounds, max_tokens, prompt = args[0], *(int(a) for a in args[1:5])
    results: dict[str, list[tuple[float, float]]] = {"http": [], "zmq": [], "engine": []}
    with _daemon(model) as url, _worker(model) as endpoint:
        for r in range(rounds):
            results["http"].append(_http(url, n, max_tokens, prompt))
            results["zmq"].append(_zmq(endpoint, n, max_tokens, prompt))
            results["engine"].append(_engine(model, n, max_tokens, prompt))
            line = "  ".join(f"{k} {v[-1][0]:.1f} / {v[-1][1]:.1f}" for k, v in results.items())
            print(f"round {r + 1}: {line}", flush=True)
    summary: dict[str, Any] = {
        "model": model,
        "n": n,
        "rounds": rounds,
        "max_tokens": max_tokens,
        "prompt_tokens": prompt,
    }
    print(f"\nmedians of {rounds} rounds (tok/s at 1 / at {n}, ratio; median of per-round ratios)")
    for way, pairs in results.items():
        c1, cn = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[1] / p[0] for p in pairs)
        print(f"  {way:7} {c1:8.1f} / {cn:8.1f}  {cn / c1:.2f}x  ({ratio:.2f}x)")
        summary[way] = {
            "c1": c1,
            f"c{n}": cn,
            "ratio_of_medians": cn / c1,
            "median_ratio": ratio,
            "rounds": pairs,
        }
    print(json.dumps(summary))
    return 0


def _http(url: str, n: int, max_tokens: int, prompt: int) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [
                PY,
                "-m",
                "mlxd",
                "bench",
                "run",
                "--url",
                url,
                "--model",
                "m",
                "--concurrency",
                f"1,{n}",
                "--max-tokens",
                str(max_tokens),
                "--prompt-tokens",
                str(prompt),
                "--json",
                f.name,
            ],
            check=True,
            capture_output=True,
        )
        rows = json.load(open(f.name))["rows"]
    return rows[0]["output_tok_s"], rows[1]["output_tok_s"]


def _zmq(endpoint: str, n: int, max_tokens: int, prompt: int) -> tuple[float, float]:
    out = []
    for level in (1, n):
        line = subprocess.run(
            [
                PY,
                str(ROOT / "bench" / "bench_zmq.py"),
                endpoint,
                str(level),
                str(max_tokens),
                str(prompt),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        out.append(json.loads(line.strip().splitlines()[-1])["output_tok_s"])
    return out[0], out[1]


def _engine(model: str, n: int, max_tokens: int, prompt: int) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [
                PY,
                "-m",
                "mlxd",
                "bench",
                "engine",
                "--model",
                model,
                "--concurrency",
                f"1,{n}",
                "--max-tokens",
                str(max_tokens),
                "--prompt-tokens",
                str(prompt),
                "--no-compare-mlx-lm",
                "--json",
                f.name,
            ],
            check=True,
            capture_output=True,
        )
        rows = json.load(open(f.name))["rows"]
    return rows[0]["output_tok_s"], rows[1]["output_tok_s"]


class _daemon:
    """``mlxd start`` serving MODEL as ``m``; yields its URL."""

    def __init__(self, model: str) -> None:
        self.model = model

    def __enter__(self) -> str:
        port = free_port()
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "mlxd",
                "start",
                "--model",
                f"m={self.model}",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, self.proc)
        return url

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


class _worker:
    """``mlxd worker serve`` alone on an ipc endpoint; yields the endpoint."""

    def __init__(self, model: str) -> None:
        self.model = model

    def __enter__(self) -> str:
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='mlxd-ratio-')}/w.sock"
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "mlxd",
                "worker",
                "serve",
                "--model",
                self.model,
                "--bind",
                endpoint,
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        path = endpoint.removeprefix("ipc://")
        while not os.path.exists(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start")
            time.sleep(0.2)
        return endpoint

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


if __name__ == "__main__":
    raise SystemExit(main())
