"""A chunk's cost beside running streams: the budget's inverse, and the knee of a real shape."""

from __future__ import annotations

import math

import pytest

from mlxd.worker.sched.prefill_cost import PrefillCost


@pytest.mark.parametrize("start", [0, 100, 3000, 30000])
@pytest.mark.parametrize("budget", [16, 512, 2048])
def test_tokens_within_is_the_most_the_budget_pays_for(start: int, budget: int) -> None:
    cost = PrefillCost(knee=3800.0)
    n = cost.tokens_within(budget, start)
    assert n == 1 or cost.of(start, n) <= budget
    assert cost.of(start, n + 1) > budget


def test_a_prompts_first_chunk_costs_its_tokens() -> None:
    assert PrefillCost(knee=3800.0).tokens_within(2048, 0) == 2048


def test_an_unknown_shape_costs_tokens() -> None:
    assert PrefillCost().of(30000, 512) == 512
    assert PrefillCost().tokens_within(512, 30000) == 512


def test_the_knee_of_a_llama_shape_is_its_projections_over_its_attention() -> None:
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=1000,
    )
    # per layer: q, o 256x256; k, v 256x128; gate, up, down 256x512 (norms are vectors)
    per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512
    knee = PrefillCost.for_model(llama.Model(args)).knee
    assert math.isclose(knee, per_layer * 2 / (2 * 4 * 64 * 2))
