"""Quantized matmul of a decode batch, (B, 1, K) as given vs flattened to (B, K): time per call.

python scripts/profile_qmm_batch.py [K=3072] [N=8192] [BATCHES=1,8,64,128]
"""

from __future__ import annotations

import json
import sys
import time

import mlx.core as mx


def per_call_ms(fn, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    mx.eval(fn())
    start = time.perf_counter()
    for _ in range(reps):
        mx.eval(fn())
    return (time.perf_counter() - start) / reps * 1000


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 3072
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    batches = [int(b) for b in (sys.argv[3] if len(sys.argv) > 3 else "1,8,64,128").split(",")]
    w = mx.random.normal((n, k)).astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    for b in batches:
        x = mx.random.normal((b, 1, k)).astype(mx.bfloat16)

        def qmm(a):  # type: ignore[no-untyped-def]
            return mx.quantized_matmul(a, wq, scales, biases, transpose=True, group_size=64, bits=4)

        as_given = per_call_ms(lambda: qmm(x))  # noqa: B023
        flat = per_call_ms(lambda: qmm(x.reshape(b, k)))  # noqa: B023
        dense = per_call_ms(lambda: x @ w.T)  # noqa: B023
        same = mx.allclose(qmm(x).reshape(b, n), qmm(x.reshape(b, k)), atol=1e-2).item()
        print(json.dumps({"batch": b, "as_given_ms": round(as_given, 3), "flat_ms": round(flat, 3),
                          "bf16_ms": round(dense, 3), "same": same}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
