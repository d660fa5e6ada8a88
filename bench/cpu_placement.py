"""Whether one stream's decode step depends on where its process runs: mlx-lm's
``generate_step`` on one row in fresh processes, unpinned and pinned to CPUs, alternated.

    python bench/cpu_placement.py MODEL_DIR [--tokens 256] [--rounds 3] [--json FILE]

Why (issue 41): one stream on an H200 is host-bound (a 1B model's weights take under a
millisecond to read; its step took 7-12 ms), and the same build's one stream stepped 1.2-1.6x
apart from start to start (a MoE row 14-28 ms in run CM1, a sliding one 8.2-10.6 ms in SL1).
If that spread follows where the process lands (a NUMA node away from the GPU, cores it
migrates between), pinning the worker removes it. Legs, each a fresh process: ``free`` (every
CPU allowed), ``local`` (the CPUs of the GPU's NUMA node, from sysfs, where they are fewer than
those allowed), ``two`` (two CPUs of that node). Each prints the step p50 and p95 (ms, from
token to token after ``--skip`` tokens) and the CPUs its main thread was seen on; the table
gives each leg's median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    args = _parser().parse_args()
    if args.child:
        print(json.dumps(_child(args)), flush=True)
        return
    legs = _legs()
    print(json.dumps({"allowed": _spell(os.sched_getaffinity(0)), "legs": legs}), flush=True)
    results: dict[str, list[dict]] = {leg: [] for leg in legs}
    for r in range(args.rounds):
        order = list(legs) if r % 2 == 0 else list(reversed(legs))
        for leg in order:
            results[leg].append(_run_child(args, legs[leg]))
            print(f"round {r + 1} {leg}: {results[leg][-1]}", flush=True)
    for leg, runs in results.items():
        p50 = statistics.median(run["p50_ms"] for run in runs)
        print(f"{leg}: step p50 median {p50:.2f} ms over {[run['p50_ms'] for run in runs]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"legs": legs, "results": results}, indent=1))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--skip", type=int, default=16, help="first tokens left out of the times")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def _legs() -> dict[str, list[int]]:
    """Each leg's CPUs: all allowed, the GPU's node's (if fewer), two of those."""
    allowed = sorted(os.sched_getaffinity(0))
    local = sorted(set(_gpu_local_cpus()) & set(allowed)) or allowed
    legs = {"free": allowed}
    if len(local) < len(allowed):
        legs["local"] = local
    legs["two"] = local[:2]
    return legs


def _gpu_local_cpus() -> list[int]:
    """The CPUs sysfs lists as local to the first visible GPU (empty where none is known)."""
    try:
        bus = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            .stdout.split()[0]
            .lower()
        )
        text = Path(f"/sys/bus/pci/devices/{bus[-12:]}/local_cpulist").read_text()
    except (OSError, subprocess.SubprocessError, IndexError):
        return []
    return _parse_list(text.strip())


def _parse_list(text: str) -> list[int]:
    """A kernel CPU list such as ``0-7,16-23``."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _cpu() -> int:
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat)."""
    return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])


def _spell(cpus: set[int] | list[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def _run_child(args: argparse.Namespace, cpus: list[int]) -> dict:
    cmd = [sys.executable, __file__, args.model, "--child", "--tokens", str(args.tokens)]
    cmd += ["--skip", str(args.skip)]

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    out = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=pin).stdout
    return json.loads(out.strip().splitlines()[-1])


def _child(args: argparse.Namespace) -> dict:
    """One process: load, one warm request, then a timed one token by token."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxd.bench.stats import percentile

    model, _ = load(args.model)
    prompt = mx.array([100 + (j * 31) % 1000 for j in range(128)])
    for _ in generate_step(prompt, model, max_tokens=8):
        pass
    stamps, seen = [], set()
    for _ in generate_step(prompt, model, max_tokens=args.tokens):
        stamps.append(time.perf_counter())
        seen.add(_cpu())
    timed = stamps[args.skip :]
    gaps = [1e3 * (b - a) for a, b in zip(timed, timed[1:], strict=False)]
    return {
        "p50_ms": round(percentile(gaps, 50), 3),
        "p95_ms": round(percentile(gaps, 95), 3),
        "cpus_seen": _spell(seen),
    }


if __name__ == "__main__":
    main()
