"""Does a new (qL, kL) shape cost a one-time build in MLX's SDPA on this backend?"""

import time

import mlx.core as mx


def run(qL, kL, masked, dtype=mx.bfloat16):
    q = mx.random.normal((4, 16, qL, 64)).astype(dtype)
    k = mx.random.normal((4, 8, kL, 64)).astype(dtype)
    v = mx.random.normal((4, 8, kL, 64)).astype(dtype)
    mask = None
    if masked:
        mask = mx.ones((4, 1, qL, kL), dtype=mx.bool_)
    mx.eval(q, k, v)
    t = time.perf_counter()
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    mx.eval(o)
    return (time.perf_counter() - t) * 1e3


for masked in (False, True):
    for qL in (1, 4, 9):
        run(qL, 512, masked)
        fresh = [run(qL, 600 + i, masked) for i in range(20)]
        same = [run(qL, 640, masked) for i in range(20)]
        print(
            f"masked={masked} qL={qL}: new kL each call median {sorted(fresh)[10]:.2f} ms "
            f"max {max(fresh):.1f}; same kL median {sorted(same)[10]:.2f} ms",
            flush=True,
        )
for qL in (2, 3, 5, 7):
    print("first call qL", qL, f"{run(qL, 777, True):.1f} ms, again {run(qL, 777, True):.2f} ms")
