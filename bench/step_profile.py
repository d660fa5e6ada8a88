"""Where a decode step's time goes, in-process: mlxd's engine against mlx-lm on the same prompts.

    python bench/step_profile.py MODEL_DIR [--rows 1] [--max-tokens 256] [--top 25]

For ``--rows`` concurrent requests (128-token prompts, greedy, eos ignored): the engine's
tok/s and decode step p50, then mlx-lm's own (``generate_step`` at one row, ``BatchGenerator``
above), each unprofiled and then under cProfile. The profile's top functions by own time show
the host's share: time inside ``eval``/``item``/``tolist`` is the host waiting for the GPU;
the rest is Python and graph building that a fast GPU step cannot hide. Figures for issue 41
(hybrids at one stream, the MoE at 16).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time
from collections.abc import Callable
from typing import Any

from mlxd.bench.engine import (
    engine_level,
    load_served,
    mlx_lm_batch_level,
    mlx_lm_single,
    new_engine,
)
from mlxd.config import SchedulerConfig

PROMPT_TOKENS = 128


def prompts(rows: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(PROMPT_TOKENS)] for _ in range(rows)]


def profiled(label: str, run: Callable[[], Any], top: int) -> Any:
    """``run()`` under cProfile; prints its top functions by own time and by cumulative time."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    result = prof.runcall(run)
    wall = time.perf_counter() - t0
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"== {label}: profiled wall {wall:.2f} s, {result}")
    print(out.getvalue())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    model, tokenizer = load_served(args.model)
    work = prompts(args.rows, len(tokenizer))
    sched = SchedulerConfig(max_num_seqs=max(args.rows, 8))
    engine = new_engine(model, tokenizer, sched, max_context=PROMPT_TOKENS + args.max_tokens + 64)

    def mlxd() -> dict[str, Any]:
        return dict(engine_level(engine, work, args.max_tokens))

    def mlx_lm() -> dict[str, float]:
        if args.rows == 1:
            return mlx_lm_single(model, work[0], args.max_tokens)
        return mlx_lm_batch_level(model, work, args.max_tokens)

    for label, run in (("mlxd", mlxd), ("mlx-lm", mlx_lm)):
        run()  # kernels built
        for _ in range(2):
            print(f"== {label} rows={args.rows}: {run()}", flush=True)
    for label, run in (("mlxd", mlxd), ("mlx-lm", mlx_lm)):
        profiled(f"{label} rows={args.rows}", run, args.top)


if __name__ == "__main__":
    main()
