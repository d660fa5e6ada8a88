"""What a verification's attention costs on this backend, by how it is asked (issue 20).

A verification scores ``L`` = 1 + draft tokens per row. Over decode's read view one row's keys
are one contiguous run, so its attention is mlx-lm's own multi-token step: ``mask="causal"``
(bottom-right aligned), no array mask. This probe times, with a new key length on every call
(a context one step longer each time, as in serving) and with the same one:

- ``causal``: (1, Hq, L, D) queries, ``mask="causal"``, for L = 1..16;
- ``masked``: (4, Hq, L, D) with an array mask (rows of different lengths);
- ``manual``: the same attention as matmuls and a softmax (no fused kernel, no plan).

Heads: SmolLM2-135M's (9 query heads, 3 KV heads of 64), float16. Prints one line per case.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx

HQ, HKV, D = 9, 3, 64
DTYPE = mx.float16


def _inputs(b: int, q_len: int, k_len: int) -> tuple[mx.array, mx.array, mx.array]:
    q = mx.random.normal((b, HQ, q_len, D)).astype(DTYPE)
    k = mx.random.normal((b, HKV, k_len, D)).astype(DTYPE)
    v = mx.random.normal((b, HKV, k_len, D)).astype(DTYPE)
    mx.eval(q, k, v)
    return q, k, v


def causal(q_len: int, k_len: int) -> mx.array:
    q, k, v = _inputs(1, q_len, k_len)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")


def masked(q_len: int, k_len: int) -> mx.array:
    q, k, v = _inputs(4, q_len, k_len)
    mask = mx.ones((4, 1, q_len, k_len), dtype=mx.bool_)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)


def manual(q_len: int, k_len: int) -> mx.array:
    q, k, v = _inputs(1, q_len, k_len)
    g = HQ // HKV
    qg = q.reshape(1, HKV, g * q_len, D)
    scores = (qg * 0.125) @ k.swapaxes(-1, -2)
    rows = mx.arange(q_len)[:, None] + (k_len - q_len)
    bias = mx.where(mx.arange(k_len)[None] <= rows, 0.0, -mx.inf).astype(scores.dtype)
    scores = scores.reshape(1, HKV, g, q_len, k_len) + bias
    probs = mx.softmax(scores.astype(mx.float32), axis=-1).astype(DTYPE)
    return (probs.reshape(1, HKV, g * q_len, k_len) @ v).reshape(1, HQ, q_len, D)


def _time(fn, q_len: int, k_len: int) -> float:
    q = fn(q_len, k_len)  # inputs built and evaluated inside; time the attention only
    t = time.perf_counter()
    mx.eval(q)
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    print(f"device {mx.default_device()}", flush=True)
    for name, fn, lengths in (("causal", causal, (1, 2, 3, 4, 5, 8, 9, 16)),
                              ("masked", masked, (1, 2, 4, 9)),
                              ("manual", manual, (2, 5, 9, 16))):  # fmt: skip
        for q_len in lengths:
            _time(fn, q_len, 512)
            fresh = [_time(fn, q_len, 700 + 3 * i + q_len) for i in range(24)]
            same = [_time(fn, q_len, 640) for _ in range(24)]
            print(f"{name:7s} L={q_len:2d}: new key length median {statistics.median(fresh):6.2f} "
                  f"ms max {max(fresh):7.1f}; same median {statistics.median(same):5.2f} ms",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
