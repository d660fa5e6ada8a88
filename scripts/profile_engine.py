"""Profile the in-process engine at one concurrency level (host time vs device wait).

python scripts/profile_engine.py MODEL_DIR [CONCURRENCY] [MAX_TOKENS]
PAGED=0: the contiguous cache.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.bench.workload import make_prompts
from mlxd.config import SchedulerConfig


def main() -> None:
    path = sys.argv[1]
    level = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    model, tok = load_served(path)
    prompts = make_prompts(level, 128, seed=level)
    sched = SchedulerConfig(max_num_seqs=level, max_queued=level)
    engine = new_engine(model, tok, sched, 128 + max_tokens + 8, os.environ.get("PAGED") != "0")
    engine_level(engine, prompts, 16)
    prof = cProfile.Profile()
    prof.enable()
    row = engine_level(engine, prompts, max_tokens)
    prof.disable()
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


if __name__ == "__main__":
    main()
