"""Which runner a model gets, from what its layers ask for: the paged pool holds plain K/V
caches that batch rows of different lengths; anything else runs on the model's own caches,
batched when a probe at load says it can be."""

from __future__ import annotations

from pathlib import Path

import mlx_lm
import pytest

from mlxd.models.zoo import make_zoo_model
from mlxd.worker.kv import layer_caches
from mlxd.worker.runners.paged import check_model_supported

pytestmark = [pytest.mark.model, pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.mark.parametrize(
    ("arch", "why", "batches"),
    [
        ("qwen3", "", True),
        ("mistral3", "", True),  # windows on plain caches: the pool masks them
        ("gpt_bigcode", "KVCache layers that cannot batch rows of different lengths", False),
        ("gemma2", "KVCache layers that cannot batch rows of different lengths", False),
        ("nemotron_h", "ArraysCache, KVCache layer caches", True),
        ("llama4", "ChunkedKVCache, KVCache layer caches", False),  # no merge
        ("afm7", "KVCache layer caches", False),  # batched logits differ from alone
    ],
)
def test_each_model_gets_the_runner_its_layers_need(
    arch: str, why: str, batches: bool, tmp_path: Path
) -> None:
    model = mlx_lm.load(str(make_zoo_model(tmp_path / arch, arch)))[0]
    assert check_model_supported(model) == why
    assert layer_caches.batches_rows(model) is batches
