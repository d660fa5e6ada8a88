"""What a worker's warm-up builds, stage by stage: the engine of ``MODEL`` built in-process as a
worker builds it, warm-up run twice without a bound (the first builds, the second shows what is
left once built), every step over ``--slow-s`` logged, and the kernels MLX's CUDA backend
compiles with NVRTC counted as they land in its PTX cache (``MLX_PTX_CACHE_DIR``, by default
under the temporary folder and kept between processes). Run MS1's MoE warm-up spent 6 s at 2
rows, 0.6 s at 4 and 36 s at 8 (docs/PERFORMANCE.md): run it once with an empty cache and once
again to tell compiles from the rest.

    python bench/warmup_trace.py MODEL [--ptx-cache DIR] [--fresh] [--json PATH]

Prints one JSON line per stage of each pass: seconds, steps over ``--slow-s``, and the PTX files
that appeared during it (count and the first few names).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any


def watch(folder: Path, engine: Any, seen: dict[str, str], stop: threading.Event) -> None:
    """Record each new file in ``folder`` under the warm-up stage running when it appeared."""
    while not stop.wait(0.1):
        for path in folder.rglob("*"):
            if path.is_file() and path.name not in seen:
                seen[path.name] = engine.warming or "(between stages)"


def passes(engine: Any, folder: Path, count: int, slow_s: float) -> list[dict[str, Any]]:
    """Run warm-up ``count`` times; each stage's time, slow steps and new PTX files."""
    from mlxd.worker import warmup

    rows: list[dict[str, Any]] = []
    steps: list[tuple[str, float]] = []
    timed = warmup._timed_step

    def step(eng: Any, stage: Any, clock: Any) -> None:
        started = time.perf_counter()
        timed(eng, stage, clock)
        if (took := time.perf_counter() - started) > slow_s:
            steps.append((stage.name, round(took, 3)))

    stamps: list[tuple[str, float]] = []
    log_stage = warmup.log.info

    def info(msg: str, *args: Any) -> None:
        if msg.startswith("warm-up: %s in"):
            stamps.append((args[0], round(args[1], 3)))
        log_stage(msg, *args)

    warmup._timed_step = step  # type: ignore[assignment]
    for n in range(1, count + 1):
        seen: dict[str, str] = {p.name: "before" for p in folder.rglob("*") if p.is_file()}
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(folder, engine, seen, stop), daemon=True)
        watcher.start()
        warmup.log.info = info  # type: ignore[method-assign]
        warmup.warm_up(engine, budget_s=3600.0)
        warmup.log.info = log_stage  # type: ignore[method-assign]
        stop.set()
        watcher.join()
        for name, seconds in stamps:
            new = sorted(f for f, at in seen.items() if at.startswith(name))
            slow = [t for s, t in steps if s == name]
            rows.append(
                {
                    "pass": n,
                    "stage": name,
                    "s": seconds,
                    "slow_steps_s": slow,
                    "ptx_new": len(new),
                    "ptx_names": new[:6],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        steps.clear()
        stamps.clear()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ptx-cache", default=os.environ.get("MLX_PTX_CACHE_DIR", "/tmp/mlxd-ptx"))
    ap.add_argument("--fresh", action="store_true", help="empty the PTX cache first")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--slow-s", type=float, default=0.25)
    ap.add_argument("--json")
    args = ap.parse_args()
    folder = Path(args.ptx_cache)
    if args.fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MLX_PTX_CACHE_DIR"] = str(folder)  # read when MLX compiles its first kernel

    import logging

    from mlxd.bench.engine import load_served, new_engine
    from mlxd.config import SchedulerConfig
    from mlxd.worker.runners.served import for_this_process

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    started = time.perf_counter()
    model, tokenizer = load_served(args.model)
    for_this_process(model)
    engine = new_engine(model, tokenizer, SchedulerConfig(), max_context=8192)
    before = sum(1 for p in folder.rglob("*") if p.is_file())
    print(json.dumps({"loaded_s": round(time.perf_counter() - started, 2), "ptx_before": before}))
    rows = passes(engine, folder, args.passes, args.slow_s)
    if args.json:
        Path(args.json).write_text(json.dumps({"ptx_before": before, "stages": rows}, indent=1))


if __name__ == "__main__":
    main()
