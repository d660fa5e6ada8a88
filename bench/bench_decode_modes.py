"""How decode reads K/V, in-process: the paged pool through a view of the batch (the default),
the pool's blocks gathered every step, and the contiguous cache. The three alternate, REPS
times each, so slow phases of a shared machine hit all of them; prints each one's runs and
median as JSON.

    python bench/bench_decode_modes.py MODEL_DIR [CONCURRENCY=1] [OUTPUT=128] [REPS=5]

On a CPU, a model made with ``mlxd make-model --size deep`` has a GPU's launch-bound shape.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.bench.workload import make_prompts
from mlxd.config import SchedulerConfig

MODES: dict[str, dict[str, Any]] = {
    "view": {"paged": True, "max_view_tokens": None},
    "gathered": {"paged": True, "max_view_tokens": 0},
    "contiguous": {"paged": False},
}


def main() -> None:
    path = sys.argv[1]
    level, out, reps = (int(x) for x in (sys.argv[2:] + ["1", "128", "5"][len(sys.argv) - 2 :]))
    model, tok = load_served(path)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for rep in range(reps):
        for mode, kw in MODES.items():
            sched = SchedulerConfig(max_num_seqs=level, max_queued=level)
            engine = new_engine(model, tok, sched, 128 + out + 8, **kw)
            engine_level(engine, make_prompts(level, 128, seed=1000 + rep), 16)  # warm-up
            row = engine_level(engine, make_prompts(level, 128, seed=rep), out)
            runs[mode].append({"tok_s": row["output_tok_s"], "itl_p50_ms": row["itl_p50_ms"]})
    report = {"concurrency": level, "output": out, "reps": reps}
    for mode, rows in runs.items():
        report[mode] = {
            "median_tok_s": round(statistics.median(r["tok_s"] for r in rows), 1),
            "median_itl_p50_ms": round(statistics.median(r["itl_p50_ms"] for r in rows), 2),
            "runs_tok_s": [round(r["tok_s"], 1) for r in rows],
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
