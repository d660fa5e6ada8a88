"""Decode step time: contiguous batch cache vs paged cache (portable gather path).

    python scripts/bench_paged.py MODEL_DIR [BATCH=64] [PROMPT=128] [STEPS=128] [BLOCK=32]
"""

from __future__ import annotations

import json
import sys
import time

import mlx.core as mx
import mlx_lm

from mlxd.worker.kv_cache import BatchKVCache
from mlxd.worker.paged_cache import KVPool, PagedKVCache, PagedStep


def contiguous(model, prompts: mx.array, steps: int) -> float:  # type: ignore[no-untyped-def]
    b = prompts.shape[0]
    caches = [BatchKVCache.for_prefill([0] * b) for _ in model.layers]
    tok = mx.argmax(model(prompts, cache=caches)[:, -1], axis=-1)
    mx.eval(tok)
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = mx.argmax(model(tok[:, None], cache=caches)[:, -1], axis=-1)
        mx.async_eval(tok)
    mx.eval(tok)
    return (time.perf_counter() - t0) / steps


def paged(model, prompts: mx.array, steps: int, block: int) -> float:  # type: ignore[no-untyped-def]
    b, n = prompts.shape
    per_row = (n + steps + block - 1) // block
    pool = KVPool.for_model(model, num_blocks=b * per_row, block_size=block)
    tables = [list(range(r * per_row, (r + 1) * per_row)) for r in range(b)]
    step = PagedStep.build(tables, [0] * b, [n] * b, pool)
    tok = mx.argmax(model(prompts, cache=PagedKVCache.for_step(pool, step))[:, -1], axis=-1)
    mx.eval(tok)
    ctx = [n] * b
    t0 = time.perf_counter()
    for _ in range(steps):
        step = PagedStep.build(tables, ctx, [1] * b, pool)
        tok = mx.argmax(model(tok[:, None], cache=PagedKVCache.for_step(pool, step))[:, -1], -1)
        mx.async_eval(tok)
        ctx = [c + 1 for c in ctx]
    mx.eval(tok)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    path = sys.argv[1]
    defaults = ["64", "128", "128", "32"]
    b, n, steps, block = (int(x) for x in sys.argv[2:] + defaults[len(sys.argv) - 2 :])
    model = mlx_lm.load(path)[0]
    prompts = mx.random.randint(10, 1000, (b, n))
    contiguous(model, prompts, 8)  # warm-up: kernels for these shapes compile once
    paged(model, prompts, 8, block)
    c, p = contiguous(model, prompts, steps), paged(model, prompts, steps, block)
    result = {"batch": b, "prompt": n, "steps": steps, "block": block, "contiguous_ms": c * 1e3,
              "paged_ms": p * 1e3, "paged_vs_contiguous": c / p}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
