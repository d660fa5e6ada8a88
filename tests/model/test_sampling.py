"""Per-row sampling on crafted logits: each row follows its own parameters."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.protocol.messages import SamplingParams

pytestmark = pytest.mark.model


def draw(logits: list[list[float]], rows: list[Any]) -> list[int]:
    import mlx.core as mx

    from mlxd.worker.sampling.sampling import sample

    return sample(mx.array(logits), rows).tolist()  # type: ignore[no-any-return]


def row(seed: int = 0, index: int = 0, **params: Any) -> Any:
    from mlxd.worker.sampling.sampling import SampleRow

    extra = {k: params.pop(k) for k in ("history", "output", "block_ids") if k in params}
    return SampleRow(params=SamplingParams(**params), seed=seed, index=index, **extra)


LOGITS = [5.0, 4.9, 1.0, 0.0, -1.0, -2.0]


def test_greedy_rows_take_the_argmax() -> None:
    assert draw([LOGITS, LOGITS[::-1]], [row(temperature=0), row(temperature=0)]) == [0, 5]


def test_logit_bias_and_banned_ids_apply_per_row() -> None:
    rows = [
        row(temperature=0, logit_bias={3: 10.0}),
        row(temperature=0, block_ids=[0]),
        row(temperature=0),
    ]
    assert draw([LOGITS] * 3, rows) == [3, 1, 0]


def test_repetition_presence_and_frequency_penalties_demote_seen_tokens() -> None:
    rows = [
        row(temperature=0, repetition_penalty=2.0, history=[0]),
        row(temperature=0, presence_penalty=1.0, output=[0]),
        row(temperature=0, frequency_penalty=0.1, output=[0, 0]),
        row(temperature=0, frequency_penalty=0.01, output=[0]),
    ]
    assert draw([LOGITS] * 4, rows) == [1, 1, 1, 0]


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 0.01}, {"min_p": 0.99}])
def test_truncation_to_one_token_is_deterministic(params: dict[str, Any]) -> None:
    rows = [row(seed=s, temperature=2.0, **params) for s in range(16)]
    assert draw([LOGITS] * 16, rows) == [0] * 16


def test_top_k_two_only_samples_the_best_two() -> None:
    rows = [row(seed=s, temperature=5.0, top_k=2) for s in range(64)]
    picks = set(draw([LOGITS] * 64, rows))
    assert picks == {0, 1}


def test_same_seed_and_index_same_token_other_seeds_vary() -> None:
    flat = [[0.0] * 50]
    same = {draw(flat, [row(seed=42, index=3, temperature=1.0)])[0] for _ in range(5)}
    varied = {draw(flat, [row(seed=s, index=3, temperature=1.0)])[0] for s in range(20)}
    assert len(same) == 1 and len(varied) > 5
