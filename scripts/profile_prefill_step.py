"""Where one request's time to first token goes inside the engine, by engine function.

    python scripts/profile_prefill_step.py MODEL_DIR [PROMPT=16] [POOL_GB=1,30] [REPEATS=5]

For each KV pool size (a small pool, and one as large as a server's), one request of ``PROMPT``
tokens at a time through the paged engine, first token only, after one unmeasured request. The
engine's steps are timed as a whole and by function (host graph building, device waits,
scheduling), so a fixed cost per prefill shows where it lives; a TTFT that grows with the pool
means the pool is copied. One JSON line per pool size: the TTFT median and each function's
median ms per request.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig
from mlxd.worker.kv.paged_cache import KVPool

# (module, class, method): the steps of a prefill, outermost first
TIMED = [
    ("mlxd.worker.engine", "Engine", "_on_generate"),
    ("mlxd.worker.engine", "Engine", "_prefill"),
    ("mlxd.worker.sched.scheduler", "Scheduler", "schedule_prefill"),
    ("mlxd.worker.runners.paged", "PagedModelRunner", "_forward"),
    ("mlxd.worker.kv.paged_cache", "PagedStep", "build"),
    ("mlxd.worker.runners.base", "ModelRunner", "_sample"),
    ("mlxd.worker.runners.base", "ModelRunner", "_join"),
    ("mlxd.worker.engine", "Engine", "_decode"),
    ("mlxd.worker.engine", "Engine", "_flush"),
]


def instrument(spent: dict[str, float]) -> None:
    import importlib

    for module, cls_name, name in TIMED:
        cls = getattr(importlib.import_module(module), cls_name)
        raw = cls.__dict__[name]
        kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        wrapped = _timed(raw.__func__ if kind else raw, f"{cls_name}.{name}", spent)
        setattr(cls, name, kind(wrapped) if kind else wrapped)


def _timed(fn: Callable[..., Any], key: str, spent: dict[str, float]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += (time.perf_counter() - start) * 1000

    return run


def main() -> None:
    args = sys.argv[2:] + ["16", "1,30", "5"][len(sys.argv) - 2 :]
    prompt, pools, repeats = int(args[0]), [float(s) for s in args[1].split(",")], int(args[2])
    model, tok = load_served(sys.argv[1])
    spent: dict[str, float] = defaultdict(float)
    instrument(spent)
    rng = random.Random(0)
    per_token = KVPool.bytes_per_token(model)
    for gb in pools:
        context = int(gb * 2**30 / per_token / 8)  # new_engine sizes the pool for 8 of these
        engine = new_engine(model, tok, SchedulerConfig(max_num_seqs=8, max_queued=64), context)
        engine_level(engine, [[rng.randrange(10, 1000) for _ in range(prompt)]], 1)
        ttfts, parts = [], defaultdict(list)
        for _ in range(repeats):
            spent.clear()
            p = [rng.randrange(10, 1000) for _ in range(prompt)]
            ttfts.append(float(engine_level(engine, [p], 1)["ttft_p50_ms"]))
            for k, v in spent.items():
                parts[k].append(v)
        pool_gb = engine.runner.pool.nbytes / 2**30
        row = {"prompt": prompt, "pool_gb": round(pool_gb, 2),
               "ttft_p50_ms": round(statistics.median(ttfts), 2),
               "ms": {k: round(statistics.median(v), 2) for k, v in parts.items()}}  # fmt: skip
        print(json.dumps(row), flush=True)
        del engine


if __name__ == "__main__":
    main()
