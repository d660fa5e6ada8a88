"""Models with recurrent state (Mamba; the LFM2 hybrid of short convolutions and attention):
state per row in the contiguous runner, prompts prefilled one at a time; greedy output equals
mlx-lm's one prompt at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from mlxd.models.maker import make_model
from mlxd.protocol.messages import Cancel
from mlxd.worker.runners.paged import check_model_supported
from tests.model.conftest import Harness
from tests.model.test_engine import PROMPTS, reference

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=["mamba", "lfm2"])
def mamba_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(
        tmp_path_factory.mktemp(request.param) / "m",
        arch=request.param,
        size="tiny",
        progress=lambda line: None,
    )


def test_state_space_models_are_served_on_the_contiguous_runner(mamba_model: Path) -> None:
    model = mlx_lm.load(str(mamba_model))[0]
    kinds = {type(c).__name__ for c in model.make_cache()}
    assert kinds in ({"ArraysCache"}, {"ArraysCache", "KVCache"})  # pure, or a hybrid
    assert check_model_supported(model) == " layer caches".join(
        ["ArraysCache" if kinds == {"ArraysCache"} else "ArraysCache, KVCache", ""]
    )


@pytest.mark.parametrize("prefill_chunk", [16, 512], ids=["chunked", "whole"])
def test_batched_state_space_decode_equals_mlx_lm(mamba_model: Path, prefill_chunk: int) -> None:
    """Rows join mid-decode, one is cancelled and leaves, the others keep their state."""
    h = Harness(mamba_model, paged=False, prefill_chunk=prefill_chunk)
    try:
        for i, prompt in enumerate(PROMPTS[:3]):
            h.generate(str(i), prompt, max_tokens=24, ignore_eos=True)
        h.generate("gone", PROMPTS[4], max_tokens=24, ignore_eos=True)
        h.step(5)
        h.send(Cancel(request_id="gone"))
        h.generate("3", PROMPTS[3], max_tokens=24, ignore_eos=True)  # joins a running batch
        results: dict[str, Any] = h.run()
        assert h.engine.runner.kv_bytes == 0  # every row's state went with it
    finally:
        h.close()
    for i, prompt in enumerate(PROMPTS[:4]):
        assert results[str(i)].token_ids == reference(mamba_model, prompt, 24), prompt
    assert len(results["gone"].token_ids) < 24
