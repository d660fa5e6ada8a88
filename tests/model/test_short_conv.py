"""Recurrent layers' short convolutions as shifted multiply-adds (``runners.short_conv``): the
same values as MLX's ``conv1d`` for a decode step's and a prompt's shapes, only plain depthwise
convolutions changed, and a served hybrid (worker and test harness alike) running them."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxd.models.maker import make_model
from mlxd.worker.runners.short_conv import TapsConv1d, as_taps, restore

pytestmark = pytest.mark.model

CHANNELS, TAPS = 48, 4


def _pair(dtype: mx.Dtype, bias: bool) -> tuple[nn.Conv1d, nn.Conv1d]:
    conv = nn.Conv1d(CHANNELS, CHANNELS, TAPS, groups=CHANNELS, bias=bias)
    if bias:
        conv.bias = mx.random.normal((CHANNELS,))
    conv.set_dtype(dtype)
    taps = nn.Conv1d(CHANNELS, CHANNELS, TAPS, groups=CHANNELS, bias=bias)
    taps.update(conv.parameters())
    assert as_taps(taps) == [taps]
    return conv, taps


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("rows,length", [(1, 1), (5, 1), (1, 37), (3, 9)])
def test_taps_equal_the_convolution(dtype: mx.Dtype, bias: bool, rows: int, length: int) -> None:
    conv, taps = _pair(dtype, bias)
    x = mx.random.normal((rows, length + TAPS - 1, CHANNELS)).astype(dtype)
    want, got = conv(x), taps(x)
    assert got.shape == want.shape == (rows, length, CHANNELS) and got.dtype == want.dtype
    tol = 1e-6 if dtype == mx.float32 else 1e-2  # float32 sums either way; bf16 rounds once
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tol, rtol=tol)


def test_only_plain_depthwise_convolutions_change() -> None:
    class Layers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.depthwise = nn.Conv1d(8, 8, 3, groups=8)
            self.dense = nn.Conv1d(8, 8, 3)  # one group: a real mixing of channels
            self.padded = nn.Conv1d(8, 8, 3, padding=2, groups=8)
            self.strided = nn.Conv1d(8, 8, 3, stride=2, groups=8)

    layers = Layers()
    changed = as_taps(layers)
    assert changed == [layers.depthwise] and type(layers.depthwise) is TapsConv1d
    assert as_taps(layers) == []  # already done: nothing changes twice
    assert {type(m) for m in (layers.dense, layers.padded, layers.strided)} == {nn.Conv1d}
    restore(changed)
    assert type(layers.depthwise) is nn.Conv1d


def test_an_input_of_another_dtype_takes_the_convolution() -> None:
    conv, taps = _pair(mx.bfloat16, bias=False)
    x = mx.random.normal((2, 6, CHANNELS))  # float32 against bfloat16 weights: promoted
    assert taps(x).dtype == conv(x).dtype == mx.float32
    assert mx.allclose(taps(x), conv(x), atol=1e-5)


def test_the_worker_loads_a_hybrid_with_taps(tmp_path: Path) -> None:
    from mlxd.worker.main import _load_model

    path = make_model(tmp_path / "m", arch="lfm2", size="tiny", progress=lambda line: None)
    model, _ = _load_model(str(path), "auto")
    convs = [m for _, m in model.named_modules() if isinstance(m, nn.Conv1d)]
    assert convs and all(type(m) is TapsConv1d for m in convs)
