"""A mixture of experts' gate and up projections as one gathered matrix multiply.

mlx-lm's ``SwitchGLU`` (the expert MLP of Qwen3-MoE, Qwen3.5-MoE, Mixtral, DeepSeek, OLMoE,
gpt-oss and the other 40-odd MoE architectures it ships) runs three ``gather_qmm`` per layer
and token: gate, up, down. Gate and up read the same gathered input with the same expert
indices, and each output row of a weight (with its scales and biases) is computed on its own,
so the two weights stacked along their output rows make one call whose output halves are the
two projections: one kernel launch, and one read of the gathered input, fewer per MoE layer
and step. Rapid-MLX ships this (after oMLX), measuring a Qwen3.6-35B-A3B's decode 7 % faster
on an M3 Ultra. On an H200 one row of the Qwen3-30B-A3B shape (4 bits) stepped in 16.5-19.0 ms
fused against 20.1-20.9 ms as mlx-lm makes it, four rounds alternated in one process, the same
greedy tokens (``bench/fused_experts.py``, run WT1); on the 2-core CPU, where the experts'
arithmetic outweighs a launch, no difference, and the two halves equal the separate calls bit
for bit (``tests/model/test_fused_experts.py``). Weights whose halves cannot stack (an nvfp4
global scale per projection, projections of different formats) stay as they are.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU, SwitchLinear

SORT_FROM = 64  # gathered rows from which tokens are sorted by expert, as ``SwitchGLU`` does
_ROWS = ("weight", "scales", "biases", "bias")  # a projection's arrays, output rows on axis 1
# ``FusedSwitchGLU`` restates ``SwitchGLU.__call__``: a later mlx-lm that calls it otherwise
# keeps its own layers (the zoo's greedy parity with mlx-lm checks the rest)
_SAME_CALL = tuple(inspect.signature(SwitchGLU.__call__).parameters) == ("self", "x", "indices")


class FusedSwitchGLU(SwitchGLU):
    """``SwitchGLU`` with ``gate_up_proj``: gate's output rows, then up's."""

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        x = mx.expand_dims(x, (-2, -3))
        indices = mx.stop_gradient(indices)
        do_sort = indices.size >= SORT_FROM
        idx, inv_order = indices, None
        if do_sort:
            x, idx, inv_order = _by_expert(x, indices)
        x_gate, x_up = mx.split(self.gate_up_proj(x, idx, sorted_indices=do_sort), 2, axis=-1)
        x = self.down_proj(self.activation(x_up, x_gate), idx, sorted_indices=do_sort)
        if do_sort:
            x = mx.unflatten(x[inv_order], 0, indices.shape)
        return x.squeeze(-2)


def _by_expert(x: mx.array, indices: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """The gathered rows in order of expert, their experts, and the order that undoes it (as
    mlx-lm's ``SwitchGLU`` sorts them)."""
    per_token = indices.shape[-1]
    flat = indices.flatten()
    order = mx.argsort(flat)
    return x.flatten(0, -3)[order // per_token], flat[order], mx.argsort(order)


@dataclass(slots=True)
class Fused:
    """One layer ``fuse`` changed, and the module its up projection was (for ``restore``)."""

    layer: nn.Module
    up: nn.Module


def stackable(gate: nn.Module, up: nn.Module) -> bool:
    """Whether ``gate`` and ``up`` stack into one projection of the same format."""
    if type(gate) is not type(up) or type(gate) not in (QuantizedSwitchLinear, SwitchLinear):
        return False
    if isinstance(gate, QuantizedSwitchLinear):
        same = (gate.group_size, gate.bits, gate.mode) == (up.group_size, up.bits, up.mode)
        if not same or gate.global_scale is not None or up.global_scale is not None:
            return False
    return [k for k in _ROWS if k in gate] == [k for k in _ROWS if k in up]


def fuse(model: nn.Module) -> list[Fused]:
    """Stack the gate and up projections of ``model``'s ``SwitchGLU`` layers (in place, a layer
    at a time, so the copy costs one layer's weights at most). Returns them, for ``restore``."""
    done: list[Fused] = []
    if not _SAME_CALL:
        return done
    for _, layer in model.named_modules():
        if type(layer) is SwitchGLU and stackable(layer.gate_proj, layer.up_proj):
            done.append(_fuse_one(layer))
    return done


def _fuse_one(layer: nn.Module) -> Fused:
    gate, up = layer.gate_proj, layer.up_proj
    for key in _ROWS:
        if key in gate:
            gate[key] = mx.concatenate([gate[key], up[key]], axis=1)
    mx.eval(gate.parameters())
    del layer.gate_proj, layer.up_proj
    for key in _ROWS:
        if key in up:
            del up[key]
    layer.gate_up_proj = gate
    layer.__class__ = FusedSwitchGLU
    return Fused(layer, up)


def restore(fused: list[Fused]) -> None:
    """Undo ``fuse`` (benchmarks measure mlx-lm on the layers as it made them). The halves are
    copied out whole: MLX's CUDA ``gather_qmm`` refuses a strided weight (WT1's first try)."""
    for item in fused:
        layer, gate, up = item.layer, item.layer.gate_up_proj, item.up
        for key in _ROWS:
            if key in gate:
                gate[key], up[key] = (mx.contiguous(h) for h in mx.split(gate[key], 2, axis=1))
        del layer.gate_up_proj
        layer.gate_proj, layer.up_proj = gate, up
        layer.__class__ = SwitchGLU
