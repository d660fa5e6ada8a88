"""Quantized layers that hand a batch to ``mx.quantized_matmul`` as rows of one matrix.

mlx.nn's ``QuantizedLinear`` passes its input as it comes, ``(B, L, K)``, so a decode step of B
rows is B separate ``(1, K)`` products against the same weight. MLX's CUDA backend runs that as
B matrix-vector kernels: on an H100 (MLX 0.32.4, 4-bit, K=3072, N=8192), 1.47 ms at B=128
against 0.12 ms for the same rows as one ``(128, K)`` matrix, 0.83 against 0.13 ms at 64
(``scripts/profile_qmm_batch.py`` (removed; at commit 6e4ae59)); a 4-bit Llama-3.2-3B decoded
64 streams at 106 ms per step
against 28 ms in bf16. Flattening the leading dimensions is the same arithmetic on every backend.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import QuantizedAllToShardedLinear, QuantizedShardedToAllLinear


def _as_rows(call: Any, x: mx.array) -> mx.array:
    if x.ndim <= 2:
        return call(x)  # type: ignore[no-any-return]
    out = call(x.reshape(-1, x.shape[-1]))
    return out.reshape(*x.shape[:-1], out.shape[-1])  # type: ignore[no-any-return]


class RowsQuantizedLinear(nn.QuantizedLinear):
    """``QuantizedLinear`` over a batch as rows of one matrix."""

    def __call__(self, x: mx.array) -> mx.array:
        return _as_rows(super().__call__, x)


class RowsQuantizedEmbedding(nn.QuantizedEmbedding):
    """``QuantizedEmbedding`` whose tied output projection takes the batch as rows."""

    def as_linear(self, x: mx.array) -> mx.array:
        return _as_rows(super().as_linear, x)


class RowsQuantizedAllToShardedLinear(QuantizedAllToShardedLinear):
    """A tensor-parallel group's column shard over a batch as rows of one matrix."""

    def __call__(self, x: mx.array) -> mx.array:
        return _as_rows(super().__call__, x)


class RowsQuantizedShardedToAllLinear(QuantizedShardedToAllLinear):
    """A tensor-parallel group's row shard (then its all_sum) over a batch as rows."""

    def __call__(self, x: mx.array) -> mx.array:
        return _as_rows(super().__call__, x)


# A group's sharded layers count as much as plain ones: without them a 4-bit Qwen3-32B shape on
# two H100s decoded 64 streams at 452 ms a step against one GPU's 112 (run Z5, issue 40).
_SWAPS: dict[type, type] = {
    nn.QuantizedLinear: RowsQuantizedLinear,
    nn.QuantizedEmbedding: RowsQuantizedEmbedding,
    QuantizedAllToShardedLinear: RowsQuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear: RowsQuantizedShardedToAllLinear,
}


def batch_as_rows(model: nn.Module) -> list[nn.Module]:
    """Make ``model``'s plain quantized layers take batches as rows (in place: the class of
    each such layer changes, its weights stay). Returns the layers changed, for ``restore``."""
    changed = []
    for _, module in model.named_modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
            changed.append(module)
    return changed


def restore(layers: list[nn.Module]) -> None:
    """Undo ``batch_as_rows`` (benchmarks measure mlx-lm on the layers as it made them)."""
    back = {new: old for old, new in _SWAPS.items()}
    for module in layers:
        module.__class__ = back[type(module)]
