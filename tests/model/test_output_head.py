"""The output projection runs on each row's last position only, with the same logits there."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

from mlxd.models.maker import make_model
from mlxd.worker.runners.output_head import LastPosition, last_position_only

pytestmark = pytest.mark.model


@pytest.mark.parametrize("arch", ["qwen3", "mistral"], ids=["tied-embeddings", "lm-head"])
def test_last_position_logits_are_the_full_models_last_ones(tmp_path: Path, arch: str) -> None:
    model = mlx_lm.load(
        str(make_model(tmp_path / arch, arch=arch, size="tiny", progress=lambda line: None))
    )[0]
    tied = getattr(model, "lm_head", None) is None
    assert tied == (arch == "qwen3")
    tokens = mx.random.randint(10, 1000, (3, 9), key=mx.random.key(0))
    full = model(tokens)
    undo = last_position_only(model)
    assert tied or isinstance(model.lm_head, LastPosition)
    last = model(tokens)
    assert last.shape == (3, 1, full.shape[-1])
    assert mx.allclose(last, full[:, -1:, :], atol=1e-5).item()
    last_position_only(model)  # already done: nothing is wrapped twice
    assert model(tokens).shape == (3, 1, full.shape[-1])
    undo()
    assert model(tokens).shape == full.shape
