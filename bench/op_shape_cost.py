"""Which operations pay for a length never seen before: each op of a Qwen3-0.6B-shaped prefill
layer timed at new lengths against the same length again, in-process (``shape_cost.py``'s
question, op by op).

    python bench/op_shape_cost.py [--tokens 352] [--count 5] [--out FILE.json]

Ops (bf16, one row): ``matmul`` (L x 1024 by 1024 x 3072), ``sdpa_causal`` (16 query heads, 8
key heads, head_dim 128, mask="causal"), ``sdpa_array`` (the same with an additive (L, L)
mask), ``rms_norm``, ``rope``, ``softmax``, ``take`` (an embedding gather), ``compiled`` (an
``mx.compile``d SwiGLU). A new length's median over the same length's median, per op.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 1024, 16, 8, 128, 3072


@mx.compile
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    return gate * mx.sigmoid(gate) * up


def ops() -> dict[str, Callable[[int], mx.array]]:
    dt = mx.bfloat16
    w = mx.random.normal((HIDDEN, FFN)).astype(dt)
    norm_w = mx.ones((HIDDEN,), dtype=dt)
    table = mx.random.normal((32000, HIDDEN)).astype(dt)

    def x(n: int, width: int = HIDDEN) -> mx.array:
        return mx.random.normal((1, n, width)).astype(dt)

    def heads(n: int, h: int) -> mx.array:
        return mx.random.normal((1, h, n, HEAD_DIM)).astype(dt)

    def sdpa(n: int, mask: str | mx.array) -> mx.array:
        q, k, v = heads(n, HEADS), heads(n, KV_HEADS), heads(n, KV_HEADS)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088, mask=mask)

    def additive(n: int) -> mx.array:
        return mx.triu(mx.full((n, n), -1e9, dtype=dt), k=1)

    return {
        "matmul": lambda n: x(n) @ w,
        "sdpa_causal": lambda n: sdpa(n, "causal"),
        "sdpa_array": lambda n: sdpa(n, additive(n)),
        "rms_norm": lambda n: mx.fast.rms_norm(x(n), norm_w, 1e-6),
        "rope": lambda n: mx.fast.rope(
            heads(n, HEADS), HEAD_DIM, traditional=False, base=1e6, scale=1.0, offset=0
        ),
        "softmax": lambda n: mx.softmax(x(n), axis=-1),
        "take": lambda n: table[mx.arange(n) % 32000],
        "compiled": lambda n: swiglu(x(n, FFN), x(n, FFN)),
    }


def timed(fn: Callable[[int], mx.array], n: int) -> float:
    began = time.perf_counter()
    mx.eval(fn(n))
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=352)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    result: dict[str, dict[str, float]] = {}
    for name, fn in ops().items():
        timed(fn, args.tokens)
        timed(fn, args.tokens)
        new, again = [], []
        for i in range(1, args.count + 1):
            n = args.tokens + 7 * i + (17 if name == "compiled" else 0)
            new.append(timed(fn, n))
            again.append(timed(fn, n))
        result[name] = {
            "new_ms": round(statistics.median(new) * 1e3, 2),
            "again_ms": round(statistics.median(again) * 1e3, 2),
        }
        print(name, result[name], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
