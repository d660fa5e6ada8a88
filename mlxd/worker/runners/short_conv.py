"""Recurrent layers' short convolutions as shifted multiply-adds, which build nothing per shape.

Gated DeltaNet (Qwen3.5, Qwen3-Next, Kimi Linear), Mamba, Jamba, LFM2 and the other hybrids run
an ``nn.Conv1d`` with one group per channel and a kernel of a few taps (4 for Qwen3.5) over
the cached tail and the new tokens. MLX's CUDA backend runs ``conv1d`` through cuDNN, which
builds a graph for every new input shape (its cache key holds the input's shape: MLX 0.32
``backend/cuda/conv.cpp``), so every new prompt length, and every new number of decode rows,
paid a build: 215-230 ms on an H200 against 0.07-0.16 ms for the shape once built (run MS1,
docs/PERFORMANCE.md). Those builds were most of what left a hybrid's first long prompt 2x a
warm one: served with these taps the Qwen3.5-0.8B shape's first 4,500-token prompt after a
start took 0.86-1.52x a warm one (median 0.99x) against 1.98-2.14x with ``conv1d``, alternated,
three starts each, and one stream and 16 in-process even within the noise (run TA1). mlx-vlm's
Qwen3.5 decodes its token so.

A depthwise convolution of K taps is K products of shifted views with a row of the weight,
summed: one fused kernel (``mx.compile(shapeless=True)``: a new length or batch traces nothing
and builds nothing), accumulated in float32 as the convolution does. On the 2-core CPU it gave
the same values bit for bit as ``mx.conv1d`` (float32 and bfloat16) and took 76 ms against 521
for 2,051 bfloat16 tokens of Qwen3.5-0.8B's 6,144 channels, 2.8-9.4x less at every shape
measured (``bench/short_conv.py``, docs/PERFORMANCE.md); on an H200 a first call at a new shape
took 0.2-0.6 ms and a repeat 0.1-0.5.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


def _taps(*arrays: mx.array) -> mx.array:
    """K shifted inputs then K weight rows: their products summed in float32."""
    k = len(arrays) // 2
    acc = arrays[0].astype(mx.float32) * arrays[k].astype(mx.float32)
    for i in range(1, k):
        acc = acc + arrays[i].astype(mx.float32) * arrays[k + i].astype(mx.float32)
    return acc.astype(arrays[0].dtype)


_TAPS = mx.compile(_taps, shapeless=True)


class TapsConv1d(nn.Conv1d):
    """A depthwise ``nn.Conv1d`` (stride 1, no padding, no dilation) as shifted multiply-adds."""

    def __call__(self, x: mx.array) -> mx.array:
        if x.dtype != self.weight.dtype:  # the convolution's promotion, not ours to copy
            return super().__call__(x)
        taps = self.weight.shape[1]
        length = x.shape[1] - taps + 1
        rows = self.weight[:, :, 0]  # (channels, taps)
        shifted = [x[:, i : i + length] for i in range(taps)]
        y = _TAPS(*shifted, *[rows[:, i] for i in range(taps)])
        return y + self.bias if "bias" in self else y


def depthwise(module: Any) -> bool:
    """Whether ``module`` is a convolution ``TapsConv1d`` computes exactly."""
    if type(module) is not nn.Conv1d:
        return False
    out_channels, _, per_group = module.weight.shape
    plain = module.stride == 1 and module.padding == 0 and module.dilation == 1
    return plain and per_group == 1 and module.groups == out_channels


def as_taps(model: nn.Module) -> list[nn.Module]:
    """Make ``model``'s depthwise convolutions ``TapsConv1d`` (in place: the class of each such
    layer changes, its weights stay). Returns the layers changed, for ``restore``."""
    changed = [m for _, m in model.named_modules() if depthwise(m)]
    for module in changed:
        module.__class__ = TapsConv1d
    return changed


def restore(layers: list[nn.Module]) -> None:
    """Undo ``as_taps`` (benchmarks measure mlx-lm on the layers as it made them)."""
    for module in layers:
        module.__class__ = nn.Conv1d
