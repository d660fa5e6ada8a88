"""A mixture of experts' gate and up projections as one (``runners.fused_experts``): the same
values as mlx-lm's three calls bit for bit, quantized and not, one row and a batch sorted by
expert; layers that cannot stack left alone; undone exactly; and a served MoE running it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.switch_layers import SwitchGLU

from mlxd.worker.runners.fused_experts import SORT_FROM, FusedSwitchGLU, fuse, restore

pytestmark = pytest.mark.model

HIDDEN, INNER, EXPERTS, TOP = 64, 96, 8, 2


def _layer(bits: int | None, dtype: mx.Dtype) -> SwitchGLU:
    layer = SwitchGLU(HIDDEN, INNER, EXPERTS)
    if bits:
        nn.quantize(layer, group_size=32, bits=bits)
    layer.set_dtype(dtype)
    mx.eval(layer.parameters())
    return layer


def _inputs(tokens: int, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    x = mx.random.normal((1, tokens, HIDDEN)).astype(dtype)
    return x, mx.random.randint(0, EXPERTS, (1, tokens, TOP))


@pytest.mark.parametrize(
    "bits,dtype",
    [(None, mx.float32), (4, mx.float32), (4, mx.bfloat16), (8, mx.bfloat16)],
    ids=["float32", "4bit-float32", "4bit-bfloat16", "8bit-bfloat16"],
)
@pytest.mark.parametrize("tokens", [1, 3, SORT_FROM // TOP], ids=["one", "few", "sorted"])
def test_fused_equals_the_three_calls_bit_for_bit(
    bits: int | None, dtype: mx.Dtype, tokens: int
) -> None:
    layer = _layer(bits, dtype)
    x, indices = _inputs(tokens, dtype)
    want = layer(x, indices)
    fused = fuse(layer)
    assert len(fused) == 1 and type(layer) is FusedSwitchGLU
    assert "gate_proj" not in layer and "up_proj" not in layer
    assert layer.gate_up_proj.weight.shape[1] == 2 * INNER
    got = layer(x, indices)
    assert got.dtype == want.dtype and mx.array_equal(got, want)
    restore(fused)
    assert type(layer) is SwitchGLU and "gate_up_proj" not in layer
    assert layer.gate_proj.weight.shape[1] == layer.up_proj.weight.shape[1] == INNER
    assert mx.array_equal(layer(x, indices), want)


def test_projections_that_cannot_stack_stay() -> None:
    mixed = _layer(4, mx.float32)
    up = SwitchGLU(HIDDEN, INNER, EXPERTS)
    nn.quantize(up, group_size=32, bits=8)  # gate in 4 bits, up in 8: no one format
    mixed.up_proj = up.up_proj
    assert fuse(mixed) == [] and type(mixed) is SwitchGLU

    class Other(SwitchGLU):  # a subclass may call its projections its own way
        pass

    other = Other(HIDDEN, INNER, EXPERTS)
    assert fuse(other) == [] and "gate_proj" in other


def test_a_served_moe_runs_fused_and_answers_as_before(tmp_path: Path) -> None:
    from mlx_lm import load

    from mlxd.models.zoo import make_zoo_model
    from mlxd.worker.runners.served import for_serving

    model, _ = load(str(make_zoo_model(tmp_path / "m", "qwen3_moe")))
    tokens = mx.array([[5, 17, 3, 250, 41, 9, 77, 2]])
    want = model(tokens)
    served = for_serving(model)
    layers = [m for _, m in model.named_modules() if isinstance(m, SwitchGLU)]
    assert layers and all(type(m) is FusedSwitchGLU for m in layers)
    assert len(served.experts) == len(layers)
    got = model(tokens)  # the head projects the last position only now
    assert mx.array_equal(got[:, -1], want[:, -1])
    served.undo()
    assert all(type(m) is SwitchGLU for m in layers)
