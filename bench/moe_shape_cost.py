"""Which of a MoE layer's ops pay for a batch shape never seen before: a Qwen3-30B-A3B-shaped
layer's expert MLP (mlx-lm's ``SwitchGLU``, 4 bits) and its attention (an array mask, as a batched
prefill has) timed at the shapes warm-up's decode stages prefill (rows x 128 tokens), the first
call against a repeat, in-process. Run MS1's warm-up spent 6 s at 2 rows, 0.6 s at 4 and 36 s at
8 (docs/PERFORMANCE.md).

    python bench/moe_shape_cost.py [--rows 1,2,4,8,16] [--tokens 128] [--tiny]

Prints one JSON line per (op, rows): first_ms, repeat_ms.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn


def timed(fn: Callable[[], mx.array]) -> float:
    started = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - started) * 1000


def experts(hidden: int, inner: int, count: int, top: int) -> Callable[[int, int], mx.array]:
    from mlx_lm.models.switch_layers import SwitchGLU

    layer = SwitchGLU(hidden, inner, count)
    nn.quantize(layer, group_size=64, bits=4)
    layer.set_dtype(mx.bfloat16)
    mx.eval(layer.parameters())

    def run(rows: int, tokens: int) -> mx.array:
        x = mx.random.normal((rows, tokens, hidden)).astype(mx.bfloat16)
        scores = mx.random.normal((rows, tokens, count))
        picked = mx.argpartition(-scores, kth=top - 1, axis=-1)[..., :top]
        return layer(x, mx.stop_gradient(picked))

    return run


def attention(heads: int, kv_heads: int, dim: int) -> Callable[[int, int], mx.array]:
    def run(rows: int, tokens: int) -> mx.array:
        q = mx.random.normal((rows, heads, tokens, dim)).astype(mx.bfloat16)
        k = mx.random.normal((rows, kv_heads, tokens, dim)).astype(mx.bfloat16)
        mask = mx.tril(mx.ones((tokens, tokens), dtype=mx.bool_))[None, None]
        mask = mx.broadcast_to(mask, (rows, 1, tokens, tokens))
        return mx.fast.scaled_dot_product_attention(q, k, k, scale=dim**-0.5, mask=mask)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tiny", action="store_true", help="small widths: a CPU check")
    args = ap.parse_args()
    shape = (128, 64, 8, 2, 4, 2, 16) if args.tiny else (2048, 768, 128, 8, 32, 4, 128)
    hidden, inner, count, top, heads, kv_heads, dim = shape
    ops = {
        "experts": experts(hidden, inner, count, top),
        "attention": attention(heads, kv_heads, dim),
    }
    for rows in (int(r) for r in args.rows.split(",")):
        for name, run in ops.items():
            call = functools.partial(run, rows, args.tokens)
            first, repeat = timed(call), min(timed(call) for _ in range(3))
            line = {"op": name, "rows": rows, "tokens": args.tokens}
            print(json.dumps({**line, "first_ms": round(first, 2), "repeat_ms": round(repeat, 2)}))


if __name__ == "__main__":
    main()
