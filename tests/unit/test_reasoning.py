"""The reasoning splitter and the worker's thinking budget, on plain strings and token ids."""

from __future__ import annotations

import pytest

from mlxd.gateway.tools.reasoning import ReasoningSplitter, Split
from mlxd.protocol.messages import Thinking, TokenDelta
from mlxd.worker.sampling.thinking import ThinkingBudget

THINK = Thinking(start="<think>", end="</think>")
OPENED = Thinking(start="<think>", end="</think>", inside=True)


def split_all(pieces: list[str], marks: Thinking | None = THINK) -> tuple[str, str]:
    """Feed ``pieces`` one by one; returns everything split into (reasoning, answer)."""
    splitter = ReasoningSplitter(marks)
    outs = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    return "".join(o.reasoning for o in outs), "".join(o.answer for o in outs)


def every_cut(text: str) -> list[list[str]]:
    """``text`` cut in two at every position, and one character at a time."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


@pytest.mark.parametrize("pieces", every_cut("<think>\nplan it\n</think>\n\nThe answer."))
def test_markers_split_at_any_boundary(pieces: list[str]) -> None:
    assert split_all(pieces) == ("plan it", "The answer.")


@pytest.mark.parametrize("pieces", every_cut("still thinking\n</think>\n\nDone"))
def test_output_starting_inside_thinking(pieces: list[str]) -> None:
    assert split_all(pieces, OPENED) == ("still thinking", "Done")


def test_no_markers_is_all_answer() -> None:
    assert split_all(["Hello ", "world <thi", "nk"], None) == ("", "Hello world <think")


def test_text_without_thinking_is_answer() -> None:
    assert split_all(["Hello", " world"]) == ("", "Hello world")


def test_a_marker_prefix_is_held_until_it_is_not_one() -> None:
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("a <th") == Split(answer="a ")
    assert splitter.feed("ing") == Split(answer="<thing")


def test_an_unfinished_marker_at_the_end_is_text() -> None:
    assert split_all(["answer <thi"]) == ("", "answer <thi")
    assert split_all(["deep </thi"], OPENED) == ("deep </thi", "")


def test_thinking_that_never_ends_is_all_reasoning() -> None:
    assert split_all(["<think>a", " b\n"]) == ("a b", "")


def test_empty_thinking_gives_no_reasoning() -> None:
    assert split_all(["<think>\n\n</think>\n\nHi"]) == ("", "Hi")


def test_one_piece_can_hold_both() -> None:
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("<think>x</think>y") == Split(reasoning="x", answer="y")


def test_the_first_delta_sets_the_markers() -> None:
    splitter = ReasoningSplitter()
    first = TokenDelta(request_id="r", text="hm</think>ok", token_ids=[1], thinking=OPENED)
    assert splitter.delta(first) == Split(reasoning="hm", answer="ok")
    later = TokenDelta(request_id="r", text="<think>again", token_ids=[2])
    assert splitter.delta(later) == Split(reasoning="again")


def test_budget_forces_the_end_marker_once_spent() -> None:
    budget = ThinkingBudget(start_id=5, end_id=6, left=2, inside=False)
    budget.follow(9)  # answer text: not counted
    assert not budget.due and not budget.near
    budget.follow(5)
    budget.follow(9)
    assert budget.near and not budget.due
    budget.follow(9)
    assert budget.due
    budget.follow(6)
    assert not budget.due and not budget.inside
