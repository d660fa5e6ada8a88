"""What one forward's kernels cost the host to launch on the GPU (issue #20): a chain of 270
matrix products (SmolLM2's count per decode step) of ``(M, 576) @ (576, 576)`` float16, for
M = 1 (a decode step's single row: MLX's own matrix-vector kernel) and M = 2..17 (a
verification's rows), timed as the host's ``mx.async_eval`` (encoding every kernel) and the
whole evaluation. Then the same with 4-bit weights (``mx.quantized_matmul``).

    python scripts/probe_encode.py
"""

from __future__ import annotations

import time

import mlx.core as mx


def chain(x: mx.array, w: mx.array, n: int, quant: tuple[mx.array, ...] | None) -> mx.array:
    for _ in range(n):
        x = mx.quantized_matmul(x, *quant, transpose=True) if quant else x @ w
        x = x * 0.01
    return x


def main() -> None:
    w = (mx.random.normal((576, 576)) * 0.02).astype(mx.float16)
    quant = mx.quantize(w, 64, 4)
    mx.eval(w, *quant)
    for label, q in (("float16", None), ("4-bit", quant)):
        for m in (1, 2, 5, 9, 17):
            x = mx.random.normal((m, 576)).astype(mx.float16)
            enc, tot = [], []
            for _ in range(12):
                t0 = time.perf_counter()
                y = chain(x, w, 270, q)
                t1 = time.perf_counter()
                mx.async_eval(y)
                t2 = time.perf_counter()
                mx.eval(y)
                t3 = time.perf_counter()
                enc.append((t2 - t1) * 1000)
                tot.append((t3 - t0) * 1000)
            enc, tot = sorted(enc[2:]), sorted(tot[2:])
            print(
                f"{label:8s} M={m:2d}  async_eval {enc[len(enc) // 2]:6.2f} ms  "
                f"build+eval {tot[len(tot) // 2]:6.2f} ms"
            )


if __name__ == "__main__":
    main()
