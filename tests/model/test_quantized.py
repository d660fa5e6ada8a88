"""Quantized layers take a batch as rows of one matrix, with the same results."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx.nn.layers.distributed import QuantizedAllToShardedLinear, QuantizedShardedToAllLinear

from mlxd.models.maker import make_model
from mlxd.worker.runners.quantized import (
    RowsQuantizedEmbedding,
    RowsQuantizedLinear,
    batch_as_rows,
    restore,
)


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory: pytest.TempPathFactory) -> nn.Module:
    path = make_model(
        tmp_path_factory.mktemp("q4") / "m",
        arch="qwen3",
        size="tiny",
        quantize_bits=4,
        progress=lambda line: None,
    )
    return mlx_lm.load(str(path))[0]


def _kinds(model: nn.Module) -> set[type]:
    return {type(m) for _, m in model.named_modules()}


def test_batch_as_rows_gives_the_same_logits_for_prefill_and_decode_shapes(
    q4_model: nn.Module,
) -> None:
    tokens = {
        shape: mx.random.randint(10, 1000, shape, key=mx.random.key(1))
        for shape in [(3, 5), (4, 1), (1, 7)]
    }
    before = {shape: q4_model(t) for shape, t in tokens.items()}
    changed = batch_as_rows(q4_model)
    try:
        # Every attention/MLP projection and the tied embedding (the tiny model's LM head).
        assert len(changed) == 7 * len(q4_model.layers) + 1
        assert {RowsQuantizedLinear, RowsQuantizedEmbedding} <= _kinds(q4_model)
        assert nn.QuantizedLinear not in _kinds(q4_model) - {RowsQuantizedLinear}
        for shape, t in tokens.items():
            after = q4_model(t)
            assert after.shape == before[shape].shape
            assert mx.allclose(after, before[shape], atol=1e-4).item(), shape
        assert batch_as_rows(q4_model) == []  # already done: nothing changes twice
    finally:
        restore(changed)
    assert not {RowsQuantizedLinear, RowsQuantizedEmbedding} & _kinds(q4_model)


def test_quantized_rows_see_two_dimensional_inputs(q4_model: nn.Module) -> None:
    changed = batch_as_rows(q4_model)
    seen: list[int] = []
    real = mx.quantized_matmul

    def spy(x: mx.array, *args: object, **kwargs: object) -> mx.array:
        seen.append(x.ndim)
        return real(x, *args, **kwargs)  # type: ignore[arg-type]

    try:
        mx.quantized_matmul = spy  # type: ignore[assignment]
        q4_model(mx.array([[5], [6], [7]]))
    finally:
        mx.quantized_matmul = real  # type: ignore[assignment]
        restore(changed)
    assert seen and set(seen) == {2}


def test_plain_models_are_left_alone(tiny_model: Path) -> None:
    model = mlx_lm.load(str(tiny_model))[0]
    assert batch_as_rows(model) == []


def test_a_quantized_model_decodes_a_batch_as_mlx_lm_decodes_each_prompt(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Through the engine, batched and with its layers taking rows, greedy output of a 4-bit
    model is mlx-lm's one prompt at a time."""
    from tests.model.conftest import Harness, load_model
    from tests.model.test_engine import PROMPTS, reference

    path = make_model(
        tmp_path_factory.mktemp("q4-engine") / "m",
        arch="qwen3",
        size="tiny",
        quantize_bits=4,
        progress=lambda line: None,
    )
    assert batch_as_rows(load_model(path)[0])  # the harness and the reference share it
    h = Harness(path)
    try:
        for i, prompt in enumerate(PROMPTS):
            h.generate(str(i), prompt, max_tokens=12, ignore_eos=True)
        results = h.run()
    finally:
        h.close()
    for i, prompt in enumerate(PROMPTS):
        assert results[str(i)].token_ids == reference(path, prompt, 12), prompt


def test_a_groups_sharded_quantized_layers_take_rows_too(tmp_path: Path) -> None:
    # A worker group's ranks shard the model before batch_as_rows (worker/main.py): the
    # sharded quantized classes must be swapped too, or a group's decode runs B matrix-vector
    # products per layer (4x slower on an H100, run Z5). A one-process group shards the same way.
    path = make_model(
        tmp_path / "m", arch="qwen3", size="tiny", quantize_bits=4, progress=lambda line: None
    )
    model = mlx_lm.load(str(path))[0]
    tokens = mx.array([[5], [6], [7]])
    before = model(tokens)
    model.shard(mx.distributed.init())
    sharded = {QuantizedAllToShardedLinear, QuantizedShardedToAllLinear}
    assert sharded <= _kinds(model)
    changed = batch_as_rows(model)
    assert not sharded & _kinds(model)
    assert len(changed) == 7 * len(model.layers) + 1
    assert mx.allclose(model(tokens), before, atol=1e-4).item()
