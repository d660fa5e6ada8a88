"""One decode step of the model as served at each batch size, and its output projection alone:
how much more a batched step costs than a single one bounds what batching can gain.

    python scripts/profile_batch_step.py MODEL_DIR [BATCHES=1,8] [REPEATS=50]

Each step is a forward of one token per row on mlx-lm's cache (16 tokens of context) and a
greedy pick, evaluated; medians in ms, one JSON line per batch size, with the best speedup
decode alone could give over one row (``rows * step_1 / step_rows``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlxd.bench.engine import load_served


def median_ms(fn: Callable[[], mx.array], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    model = load_served(sys.argv[1])[0]
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    head = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens.as_linear
    dtype = next(v.dtype for _, v in tree_flatten(model.parameters())
                 if mx.issubdtype(v.dtype, mx.floating))  # fmt: skip
    single = None
    for b in batches:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.random.randint(10, 1000, (b, 16)), cache=cache))
        token = mx.random.randint(10, 1000, (b, 1))
        step = median_ms(lambda t=token, c=cache: mx.argmax(model(t, cache=c)[:, -1], axis=-1),
                         repeats)  # fmt: skip
        hidden = mx.random.normal((b, 1, model.args.hidden_size)).astype(dtype)
        proj = median_ms(lambda h=hidden: head(h), repeats)
        single = single or step
        row = {"batch": b, "step_ms": round(step, 2), "output_projection_ms": round(proj, 2),
               "best_speedup": round(b * single / step, 2)}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
