"""Thinking on the engine: the first delta says how the output marks it, and a thinking budget
ends thinking with the end marker once spent."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.models.tokenizer_maker import EOS_TOKEN_ID

pytestmark = pytest.mark.model

THINK, END_THINK = 5, 6  # the tiny tokenizer's <think> and </think>
PROMPT = [1, 300, 301, 302, EOS_TOKEN_ID, 1, 400]


def test_the_first_delta_says_where_thinking_stands(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate_ids("open", [*PROMPT, THINK], max_tokens=3, ignore_eos=True)
    h.generate_ids("closed", [*PROMPT, THINK, 500, END_THINK], max_tokens=3, ignore_eos=True)
    results = h.run()
    opened, closed = results["open"].thinking, results["closed"].thinking
    assert opened is not None and closed is not None
    assert (opened.start, opened.end) == ("<think>", "</think>")
    assert opened.inside and not closed.inside


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("budget", [0, 1, 4])
def test_a_spent_budget_ends_thinking(harness_factory: Any, paged: bool, budget: int) -> None:
    h = harness_factory(paged=paged)
    free = h.run_alone("free", [*PROMPT, THINK], max_tokens=12)
    assert END_THINK not in free.token_ids[: budget + 1]  # else the test shows nothing
    h.generate_ids(
        "capped", [*PROMPT, THINK], max_tokens=12, ignore_eos=True, thinking_budget=budget
    )
    capped = h.run()["capped"].token_ids
    assert capped[:budget] == free.token_ids[:budget]
    assert capped[budget] == END_THINK


def test_no_budget_outside_thinking(harness_factory: Any) -> None:
    h = harness_factory()
    free = h.run_alone("free", PROMPT, max_tokens=8)
    h.generate_ids("budget", PROMPT, max_tokens=8, ignore_eos=True, thinking_budget=0)
    assert h.run()["budget"].token_ids == free.token_ids
