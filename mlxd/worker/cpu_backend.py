"""The compute dtype of a loaded model, and a matrix-product probe of what the backend reaches.

MLX's CPU backend sends only float32 (and float64) products to BLAS; float16 and bfloat16 run
on its own kernels at a few GFLOP/s, and a quantized product with half-precision activations
ran 30-70x slower than with float32 ones (docs/PERFORMANCE.md). So on the CPU, ``--dtype auto``
casts every half-precision parameter to float32 once at load, quantization scales and biases
included (else the activations stay half precision): the float weights take twice the memory.
``--dtype file`` keeps the file's dtypes; an explicit dtype casts every float parameter to it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxd.protocol.messages import ComputeInfo
from mlxd.worker import blas

log = logging.getLogger("mlxd.worker")

HALF = (mx.float16, mx.bfloat16)
PROBE_SECONDS = 0.025  # time the products for about this long, after one warm-up
PROBE_SIZE = {"cpu": 256, "gpu": 1024}  # big enough to reach BLAS / kernel speed, fast at 3 GFLOP/s


def prepare(model: Any, dtype: str) -> ComputeInfo:
    """Cast ``model``'s float weights as ``dtype`` (one of ``config.DTYPES``) asks, in place,
    then probe the backend; log both. Returns what ``worker status`` shows."""
    device = _device()
    file_dtype = float_dtype(model)
    cast(model, dtype)
    served = float_dtype(model)
    library = blas.loaded() or ""
    if device == "cpu" and not library:
        log.warning(
            "no optimized BLAS loaded (looked in %s): float32 products run on MLX's "
            "reference BLAS; on Debian/Ubuntu: apt-get install libopenblas0-pthread",
            ", ".join(map(str, blas.search_path(os.environ))) or "nowhere",
        )
    size = PROBE_SIZE[device]
    gflops = probe_gemm(size, served)
    log.info(
        "compute: %s, %s, BLAS %s: %dx%d matmul %.1f GFLOP/s",
        device,
        dtype_name(served),
        library or "none (reference)",
        size,
        size,
        gflops,
    )
    return ComputeInfo(
        device=device,
        blas=library,
        dtype=dtype_name(served),
        file_dtype=dtype_name(file_dtype),
        gemm_gflops=round(gflops, 1),
        gemm_size=size,
    )


def cast(model: Any, dtype: str) -> None:
    """Cast ``model``'s float weights as ``dtype`` asks on this backend, in place (``prepare``
    does it for the served model; a draft model needs only this)."""
    target = target_dtype(dtype, _device(), model)
    if target is None:
        return
    before, file_dtype = weights_bytes(model), float_dtype(model)
    model.set_dtype(target, predicate=_castable(dtype, target))
    mx.eval(model.parameters())
    log.info(
        "weights cast %s -> %s (--dtype %s%s): %.0f MB -> %.0f MB",
        dtype_name(file_dtype),
        dtype_name(target),
        dtype,
        ", half precision does not use BLAS on the CPU" if dtype == "auto" else "",
        before / 1e6,
        weights_bytes(model) / 1e6,
    )


def target_dtype(dtype: str, device: str, model: Any) -> mx.Dtype | None:
    """The dtype to cast ``model``'s float weights to, or None to keep them."""
    if dtype == "file":
        return None
    if dtype == "auto":
        has_half = any(v.dtype in HALF for _, v in tree_flatten(model.parameters()))
        return mx.float32 if device == "cpu" and has_half else None
    return getattr(mx, dtype)  # type: ignore[no-any-return]


def probe_gemm(size: int, dtype: mx.Dtype) -> float:
    """GFLOP/s of ``size`` x ``size`` products in ``dtype`` on the default device."""
    a = mx.random.normal((size, size), key=mx.random.key(0)).astype(dtype)
    b = mx.random.normal((size, size), key=mx.random.key(1)).astype(dtype)
    mx.eval(a @ b)  # warm-up: first-call setup, BLAS thread start
    reps, started = 0, time.perf_counter()
    while reps == 0 or time.perf_counter() - started < PROBE_SECONDS:
        mx.eval(a @ b)
        reps += 1
    return 2 * size**3 * reps / (time.perf_counter() - started) / 1e9


def float_dtype(model: Any) -> mx.Dtype:
    """The float dtype holding most of ``model``'s float parameter bytes (float32 if none)."""
    sizes: dict[mx.Dtype, int] = {}
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            sizes[v.dtype] = sizes.get(v.dtype, 0) + v.nbytes
    return max(sizes, key=sizes.__getitem__) if sizes else mx.float32


def weights_bytes(model: Any) -> int:
    return sum(int(v.nbytes) for _, v in tree_flatten(model.parameters()))


def on_cuda() -> bool:
    """Whether MLX computes on its CUDA backend here (kernels compiled at first use)."""
    return _device() == "gpu" and bool(getattr(mx, "cuda", None) and mx.cuda.is_available())


def _device() -> str:
    return "cpu" if mx.default_device() == mx.cpu else "gpu"


def _castable(dtype: str, target: mx.Dtype) -> Any:
    if dtype == "auto":
        return lambda d: d in HALF
    return lambda d: mx.issubdtype(d, mx.floating) and d != target


def dtype_name(dtype: mx.Dtype) -> str:
    """``float32`` for ``mx.float32``: how the worker's status and logs name a dtype."""
    return str(dtype).removeprefix("mlx.core.")
