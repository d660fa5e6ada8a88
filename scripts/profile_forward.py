"""One prefill forward, timed outside the engine: mlx-lm's own KV cache against the paged pool.

    python scripts/profile_forward.py MODEL_DIR [TOKENS=1,16,128] [CONTEXT=2000] [REPEATS=20]

For each number of new tokens, one row's forward as the worker runs it (the served model: last
position's logits only), then its greedy token read back, timed in two parts: building the
graph on the host, and waiting for the device. Four caches:

- ``plain``: mlx-lm's ``KVCache``, empty;
- ``paged``: the pool, no cached tokens;
- ``plain_ctx`` / ``paged_ctx``: ``CONTEXT`` tokens already cached (a prefix hit).

If ``paged`` costs what ``plain`` does, a prefill's fixed cost is the model's forward on this
backend, not the paged cache; if ``paged_ctx`` is far above ``paged``, the cached context is.
Prints one JSON line per case: medians in ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxd.bench.engine import load_served
from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

BLOCK = 32


def timed(forward: Callable[[], mx.array], repeats: int) -> dict[str, float]:
    for _ in range(3):  # kernel compiles of this shape land in none of the measured calls
        forward().item()
    build, wait = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        token = forward()
        t1 = time.perf_counter()
        token.item()
        build.append((t1 - t0) * 1000)
        wait.append((time.perf_counter() - t1) * 1000)
    total = [b + w for b, w in zip(build, wait, strict=True)]
    return {"build_ms": round(statistics.median(build), 3),
            "wait_ms": round(statistics.median(wait), 3),
            "total_ms": round(statistics.median(total), 3)}  # fmt: skip


def main() -> None:
    args = sys.argv[2:] + ["1,16,128", "2000", "20"][len(sys.argv) - 2 :]
    sizes, context, repeats = [int(s) for s in args[0].split(",")], int(args[1]), int(args[2])
    model, _ = load_served(sys.argv[1])
    longest = context + max(sizes)
    blocks = -(-longest // BLOCK)
    pool = KVPool.for_model(model, 2 * blocks, BLOCK)
    table, fresh = list(range(blocks)), list(range(blocks, 2 * blocks))  # with context, without
    prefix = mx.array([[(7 * i) % 1000 + 10 for i in range(context)]])
    warm = make_prompt_cache(model)
    model(prefix, cache=warm)
    mx.eval([c.state for c in warm])
    step = PagedStep.build([table], [0], [context], pool)  # the pool holds the same context
    mx.eval(model(prefix, cache=PagedKVCache.for_step(pool, step)), pool.keys, pool.values)

    def plain(tokens: mx.array, ctx: bool) -> mx.array:
        cache = warm if ctx else make_prompt_cache(model)
        token = model(tokens, cache=cache)[:, -1, :].argmax(-1)
        if ctx:
            for c in cache:
                c.trim(tokens.shape[1])  # the next call sees the same context
        return token

    def paged(tokens: mx.array, ctx: bool) -> mx.array:
        n = tokens.shape[1]
        s = PagedStep.build([table if ctx else fresh], [context if ctx else 0], [n], pool)
        return model(tokens, cache=PagedKVCache.for_step(pool, s))[:, -1, :].argmax(-1)

    for n in sizes:
        tokens = mx.array([[(3 * i) % 1000 + 10 for i in range(n)]])
        cases = {"plain": partial(plain, tokens, False), "paged": partial(paged, tokens, False),
                 "plain_ctx": partial(plain, tokens, True),
                 "paged_ctx": partial(paged, tokens, True)}  # fmt: skip
        for name, forward in cases.items():
            row = {"tokens": n, "cache": name, **timed(forward, repeats)}
            if name.endswith("_ctx"):
                row["context"] = context
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
