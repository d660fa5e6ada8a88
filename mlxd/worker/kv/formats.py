"""How the paged pool and decode's buffers store K/V: float arrays, or quantized (``--kv-bits``).

A K/V value here (``KV``) is a float array or, quantized, the tuple (packed ``uint32`` words,
scales, biases) that ``mx.quantize`` makes over its last axis (the head dimension, in groups of
``group_size``). The parts share every leading axis (slots, or rows x heads x columns), so
slicing, gathering, transposing and writing along those axes apply to each part alike (``each``,
``assign``, ``concat``); only attention needs floats (``KVFormat.unpack``), and
``mx.fast.scaled_dot_product_attention`` takes float K/V only, so reads dequantize per step.

A token is quantized once, where its K/V is computed, and every read dequantizes those same
parts: so it attends the same from the pool, the decode view or a prefix hit, and a prefix hit,
a preemption or a speculation rollback changes nothing within a mode. (Quantizing dequantized
values again is not exact in MLX: the parts would drift at each flush.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxd.errors import ConfigError
from mlxd.models import kv_layout

KV = Any  # mx.array, or tuple[mx.array, mx.array, mx.array] when quantized

BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize takes
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class KVFormat:
    """Float (``bits`` None) or ``bits``-bit K/V in groups of ``group_size`` along head_dim."""

    bits: int | None = None
    group_size: int = 64

    def __post_init__(self) -> None:
        if self.bits is not None and self.bits not in BITS:
            raise ConfigError(f"--kv-bits must be one of {', '.join(map(str, BITS))}")
        if self.group_size not in GROUP_SIZES:
            raise ConfigError(f"--kv-group-size must be one of {', '.join(map(str, GROUP_SIZES))}")

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    def fits(self, dim: int) -> bool:
        """Whether a head dimension of ``dim`` divides into groups and 32-bit words."""
        return self.bits is None or (dim % self.group_size == 0 and dim * self.bits % 32 == 0)

    def pack(self, x: mx.array) -> KV:
        """``x`` as stored (float: itself)."""
        if self.bits is None:
            return x
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))

    def unpack(self, kv: KV) -> mx.array:
        """Float K/V to attend to."""
        if not isinstance(kv, tuple):
            return kv
        return mx.dequantize(*kv, group_size=self.group_size, bits=self.bits)

    def zeros(self, lead: tuple[int, ...], dim: int, dtype: mx.Dtype) -> KV:
        """Zeros of shape ``(*lead, dim)`` as stored (zero scales and biases read as zeros)."""
        if self.bits is None:
            return mx.zeros((*lead, dim), dtype)
        groups = (*lead, dim // self.group_size)
        words = mx.zeros((*lead, dim * self.bits // 32), mx.uint32)
        return (words, mx.zeros(groups, dtype), mx.zeros(groups, dtype))

    def row_bytes(self, dim: int, dtype: mx.Dtype) -> int:
        """Bytes one head's ``dim`` values take as stored (the rule the daemon sizes by)."""
        return kv_layout.row_bytes(dim, dtype.size, self.bits, self.group_size)


def parts(kv: KV) -> list[mx.array]:
    """The arrays ``kv`` is stored in."""
    return list(kv) if isinstance(kv, tuple) else [kv]


def each(kv: KV, f: Callable[[mx.array], mx.array]) -> KV:
    """``f`` (an op on leading axes only) applied to every part."""
    return tuple(f(p) for p in kv) if isinstance(kv, tuple) else f(kv)


def concat(a: KV, b: KV, axis: int) -> KV:
    """``a`` then ``b`` along a leading ``axis``."""
    if not isinstance(a, tuple):
        return mx.concatenate([a, b], axis=axis)
    return tuple(mx.concatenate([x, y], axis=axis) for x, y in zip(a, b, strict=True))


def assign(dst: KV, index: Any, src: KV) -> None:
    """``dst[index] = src`` in place in every part (``index`` on leading axes only), so lists
    holding ``dst`` see the write."""
    for d, s in zip(parts(dst), parts(src), strict=True):
        d[index] = s
