"""TTFT of a shared prefix: cold, from the memory prefix cache, from the disk tier (issue 21).

Starts `mlxd start --kv-disk-gb` (the built-in model unless --model) in a fresh data directory
and streams completions of one --prefix-tokens prefix plus a short suffix of its own each:

- cold: a prefix never seen (a new one each repeat);
- memory: the warm prefix again, its blocks in the memory prefix cache;
- disk: the warm prefix after `flush-cache` moved its blocks to the disk tier.

Prints the median TTFT of --repeats requests of each and the cached tokens they reported.

    .venv/bin/python bench/prefix_ttft.py [--model NAME=PATH] [--prefix-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kv_memory import admin, free_port, wait  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="NAME=PATH (default: the built-in model)")
    ap.add_argument("--prefix-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("start_args", nargs="*", help="more `mlxd start` options (after --)")
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="mlxd-ttft-")
    os.environ["MLXD_HOME"] = home
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--kv-disk-gb",
        "4",
        *(["--model", args.model] if args.model else []),
        *args.start_args,
    ]
    daemon = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        results = _measure(url, wait(url), args)
    finally:
        daemon.terminate()
        daemon.wait(120)
    print(
        f"model {args.model or 'built-in'}, {args.prefix_tokens}-token prefix, median of "
        f"{args.repeats}"
    )
    for label, (ttfts, cached) in results.items():
        print(f"{label:8} TTFT {statistics.median(ttfts) * 1000:9.1f} ms   cached {cached}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


def _measure(url: str, name: str, args: argparse.Namespace) -> dict[str, tuple[list[float], int]]:
    n = args.prefix_tokens
    warm = [100 + (7 * j) % 5000 for j in range(n)]
    _ttft(url, name, warm + [1, 2, 3])  # the prefix's blocks into the memory cache
    out: dict[str, tuple[list[float], int]] = {}
    for label in ("cold", "memory", "disk"):
        ttfts, cached = [], 0
        for r in range(args.repeats):
            prefix = (
                [100 + (7 * j + 13 * (r + 1)) % 5000 for j in range(n)] if label == "cold" else warm
            )
            if label == "disk":
                with admin(url) as client:  # the memory cache's blocks go to the disk tier
                    client.post(f"/admin/models/{name}/flush-cache").raise_for_status()
            seconds, cached = _ttft(url, name, prefix + [40 + r, 41, 42])
            ttfts.append(seconds)
        out[label] = (ttfts, cached)
    return out


def _ttft(url: str, name: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first streamed token, and the cached tokens the usage reports."""
    body = {
        "model": name,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, cached = time.perf_counter(), None, 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("choices"):
                first = time.perf_counter() - start
            usage = event.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    assert first is not None, "no token streamed"
    return first, cached


if __name__ == "__main__":
    main()
