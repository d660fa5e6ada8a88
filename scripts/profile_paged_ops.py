"""Where a paged decode step's attention time goes, op by op, at real shapes (not a test).

python scripts/profile_paged_ops.py [BATCHES] [CONTEXTS] > ops.json

For each batch size B and context L, one layer of a Qwen3-0.6B-shaped model (8 KV heads,
16 query heads, head dim 128, bf16): the pool write of B new tokens, the block gather of each
row's K/V (as `PagedKVCache.update_and_fetch` does it), and `mx.fast.scaled_dot_product_attention`
on gathered vs contiguous K/V, with the boolean mask the paged step builds, an additive mask,
and no mask. Milliseconds per call (median of 20 after warm-up); multiply by the layer count
(28) to compare with a decode step.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import mlx.core as mx

H_KV, H_Q, D, BS, DTYPE = 8, 16, 128, 32, mx.bfloat16


def timed(fn: Callable[[], object], iters: int = 20) -> float:
    for _ in range(3):
        mx.eval(fn())
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def one(b: int, ctx: int) -> dict[str, float | int]:
    width = -(-ctx // BS)
    num_blocks = b * width + 64
    pool_k = mx.random.normal(((num_blocks + 1) * BS, H_KV, D)).astype(DTYPE)
    pool_v = mx.random.normal(((num_blocks + 1) * BS, H_KV, D)).astype(DTYPE)
    table = mx.random.permutation(num_blocks)[: b * width].reshape(b, width).astype(mx.int32)
    slots = (table[:, -1] * BS + (ctx % BS)).astype(mx.int32)
    new = mx.random.normal((b, H_KV, 1, D)).astype(DTYPE)
    q = mx.random.normal((b, H_Q, 1, D)).astype(DTYPE)
    kpos = mx.arange(width * BS)[None, None, None, :]
    bool_mask = kpos < mx.array([ctx] * b)[:, None, None, None]
    add_mask = mx.where(bool_mask, 0.0, -mx.inf).astype(DTYPE)
    mx.eval(pool_k, pool_v, table, slots, new, q, bool_mask, add_mask)

    def gather(pool: mx.array) -> mx.array:
        blocks = pool.reshape(-1, BS, H_KV, D)[table]
        return blocks.reshape(b, -1, H_KV, D).transpose(0, 2, 1, 3)

    def gather_u64(pool: mx.array) -> mx.array:
        # the same bytes as 8-byte elements: a quarter of the index arithmetic per byte
        blocks = pool.view(mx.uint64).reshape(-1, BS, H_KV, D // 4)[table]
        return blocks.view(DTYPE).reshape(b, -1, H_KV, D).transpose(0, 2, 1, 3)

    def gather_rows(pool: mx.array) -> mx.array:
        rows = pool.view(mx.uint64).reshape(-1, BS * H_KV * D // 4)
        blocks = mx.take(rows, table.reshape(-1), axis=0)
        return blocks.view(DTYPE).reshape(b, -1, H_KV, D).transpose(0, 2, 1, 3)

    def layers(fn: Callable[[mx.array], mx.array]) -> list[mx.array]:
        return [mx.contiguous(fn(p)) for _ in range(14) for p in (pool_k, pool_v)]

    def write() -> mx.array:
        pool_k[slots] = new.transpose(0, 2, 1, 3).reshape(b, H_KV, D)
        return pool_k

    kg, vg = gather(pool_k), gather(pool_v)
    kc, vc = mx.contiguous(kg), mx.contiguous(vg)
    mx.eval(kg, vg, kc, vc)
    sdpa = mx.fast.scaled_dot_product_attention
    scale = D**-0.5
    return {
        "batch": b,
        "context": ctx,
        "pool_write_ms": timed(write),
        "gather_kv_ms": timed(lambda: [mx.contiguous(gather(p)) for p in (pool_k, pool_v)]),
        "gather_view_kv_ms": timed(lambda: [gather(pool_k), gather(pool_v)]),
        "eval_overhead_ms": timed(lambda: q + 1),
        "gather_u64_kv_ms": timed(lambda: [mx.contiguous(gather_u64(p)) for p in (pool_k, pool_v)]),
        "gather_rows_kv_ms": timed(
            lambda: [mx.contiguous(gather_rows(p)) for p in (pool_k, pool_v)]
        ),  # fmt: skip
        "gather_28_layers_ms": timed(lambda: layers(gather)),
        "gather_u64_28_layers_ms": timed(lambda: layers(gather_u64)),
        "gather_rows_28_layers_ms": timed(lambda: layers(gather_rows)),
        "same_u64": bool(
            mx.array_equal(mx.contiguous(gather(pool_k)), mx.contiguous(gather_u64(pool_k))).item()
        ),  # fmt: skip
        "sdpa_gathered_boolmask_ms": timed(lambda: sdpa(q, kg, vg, scale=scale, mask=bool_mask)),
        "sdpa_contig_boolmask_ms": timed(lambda: sdpa(q, kc, vc, scale=scale, mask=bool_mask)),
        "sdpa_contig_addmask_ms": timed(lambda: sdpa(q, kc, vc, scale=scale, mask=add_mask)),
        "sdpa_contig_nomask_ms": timed(lambda: sdpa(q, kc, vc, scale=scale)),
        "gather_plus_sdpa_ms": timed(
            lambda: sdpa(q, gather(pool_k), gather(pool_v), scale=scale, mask=bool_mask)
        ),  # fmt: skip
    }


def main() -> None:
    batches = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "16,64,128").split(",")]
    contexts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "384,1152").split(",")]
    rows = []
    for b in batches:
        for ctx in contexts:
            rows.append(one(b, ctx))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"device": str(mx.default_device()), "mlx": mx.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
