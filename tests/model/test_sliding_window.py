"""Models with sliding-window layers decode on the contiguous cache, equal to mlx-lm's rotating
cache; caches the engine does not know are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from mlxd.models.maker import make_model
from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt
from mlxd.worker.kv import layer_caches
from mlxd.worker.runners.paged import check_model_supported
from tests.model.conftest import Harness, Result
from tests.model.test_engine import PROMPTS, reference, reference_ids

pytestmark = pytest.mark.model

WINDOW = 8


@pytest.fixture(scope="module")
def swa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(
        tmp_path_factory.mktemp("swa") / "m",
        arch="llama",
        size="tiny",
        sliding_window=WINDOW,
        progress=lambda line: None,
    )


def test_sliding_window_layers_use_rotating_caches_in_mlx_lm(swa_model: Path) -> None:
    model = mlx_lm.load(str(swa_model))[0]
    kinds = [type(c).__name__ for c in model.make_cache()]
    assert kinds == ["RotatingKVCache", "KVCache"]
    assert check_model_supported(model) == "KVCache, RotatingKVCache layer caches"  # not paged


def test_plain_models_go_paged_and_unbatchable_caches_run_alone(tiny_model: Path) -> None:
    from mlx_lm.models.cache import ChunkedKVCache, KVCache

    assert check_model_supported(mlx_lm.load(str(tiny_model))[0]) == ""

    class ChunkedAttention:  # the cache kinds are all the checks read
        layers = [None, None]

        def make_cache(self) -> list[Any]:
            return [ChunkedKVCache(16), KVCache()]

    assert check_model_supported(ChunkedAttention()) == "ChunkedKVCache, KVCache layer caches"
    assert not layer_caches.is_batchable(ChunkedAttention())  # no merge: one row at a time


@pytest.mark.parametrize("prefill_chunk", [16, 512], ids=["chunked", "one-padded-batch"])
def test_batched_sliding_window_decode_equals_mlx_lm(swa_model: Path, prefill_chunk: int) -> None:
    """Prompts and outputs well past the window, in one batch: keys beyond each query's window
    are masked, as mlx-lm's RotatingKVCache drops them. A 17-token prompt in 16-token chunks
    ends with a one-token chunk that must mask too."""
    h = Harness(swa_model, paged=False, prefill_chunk=prefill_chunk)
    try:
        for i, prompt in enumerate(PROMPTS):
            h.generate(str(i), prompt, max_tokens=30, ignore_eos=True)
        ids = list(range(40, 57))
        h.results["ids"] = Result()
        h.send(
            Generate(
                request_id="ids",
                prompt=TokenPrompt(token_ids=ids),
                sampling=SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
            )
        )
        results: dict[str, Any] = h.run()
    finally:
        h.close()
    for i, prompt in enumerate(PROMPTS):
        assert results[str(i)].token_ids == reference(swa_model, prompt, 30), prompt
    assert results["ids"].token_ids == reference_ids(swa_model, ids, 20)
