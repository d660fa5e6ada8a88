"""Anthropic's thinking fields read into the internal request: the switch, the budget, replayed
thinking blocks and the clear_thinking edit."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.anthropic.schemas import parse_count_tokens, parse_messages
from mlxd.gateway.surfaces.anthropic.thinking import (
    ClearThinking,
    parse_context_management,
    parse_thinking,
    signature,
)
from mlxd.protocol.messages import ChatPrompt


def turn(thought: str) -> dict[str, Any]:
    block = {"type": "thinking", "thinking": thought, "signature": "x"}
    return {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]}


def body(**fields: Any) -> dict[str, Any]:
    history = [{"role": "user", "content": "a"}, turn("t1"), {"role": "user", "content": "b"}]
    history += [turn("t2"), {"role": "user", "content": "c"}]
    return {"model": "m", "max_tokens": 50, "messages": history, **fields}


def replayed(parsed: Any) -> list[str | None]:
    assert isinstance(parsed.prompt, ChatPrompt)
    return [m.get("reasoning_content") for m in parsed.prompt.messages if m["role"] == "assistant"]


@pytest.mark.parametrize(
    ("value", "enabled", "budget"),
    [
        (None, False, None),
        ({"type": "disabled"}, False, None),
        ({"type": "adaptive"}, True, None),
        ({"type": "enabled", "budget_tokens": 31999}, True, 31999),
    ],
)
def test_parse_thinking(value: Any, enabled: bool, budget: int | None) -> None:
    switch = parse_thinking(value)
    assert (switch.enabled, switch.budget_tokens) == (enabled, budget)


@pytest.mark.parametrize(
    "value", [{"type": "on"}, {"type": "enabled"}, {"type": "enabled", "budget_tokens": 1.5}, 3]
)
def test_bad_thinking(value: Any) -> None:
    with pytest.raises(InvalidRequest):
        parse_thinking(value)


def test_clear_thinking_keep() -> None:
    edit = {"type": "clear_thinking_20251015"}
    assert parse_context_management({"edits": [edit]}) == ClearThinking(keep=1)  # the default
    assert parse_context_management({"edits": [{**edit, "keep": "all"}]}) == ClearThinking(None)
    keep3 = {**edit, "keep": {"type": "thinking_turns", "value": 3}}
    assert parse_context_management({"edits": [keep3]}) == ClearThinking(keep=3)
    assert parse_context_management({"edits": []}) is None
    assert parse_context_management(None) is None


def test_an_unknown_edit_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="clear_tool_uses_20250919") as info:
        parse_context_management({"edits": [{"type": "clear_tool_uses_20250919"}]})
    assert info.value.param == "context_management.edits[0].type"


def test_thinking_blocks_are_replayed_without_an_edit() -> None:
    parsed = parse_messages(body(thinking={"type": "enabled", "budget_tokens": 9}))
    assert replayed(parsed) == ["t1", "t2"]
    assert parsed.prompt.thinking is True and parsed.sampling.thinking_budget == 9  # type: ignore[union-attr]
    assert parsed.reasoning and parsed.echo == {}


@pytest.mark.parametrize(
    ("keep", "kept", "cleared"),
    [
        ("all", ["t1", "t2"], 0),
        ({"type": "thinking_turns", "value": 1}, [None, "t2"], 1),
        ({"type": "thinking_turns", "value": 5}, ["t1", "t2"], 0),
    ],
)
def test_clear_thinking_drops_earlier_turns(keep: Any, kept: list[Any], cleared: int) -> None:
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    parsed = parse_messages(body(context_management=edits))
    assert replayed(parsed) == kept
    (applied,) = parsed.echo["context_management"]["applied_edits"]
    assert applied["cleared_thinking_turns"] == cleared


def test_count_tokens_renders_with_the_switch() -> None:
    doc = body(thinking={"type": "adaptive"})
    del doc["max_tokens"]
    assert parse_count_tokens(doc).prompt.thinking is True  # type: ignore[union-attr]


def test_signature_is_a_digest_of_the_text() -> None:
    assert signature("a") == signature("a") != signature("b")


def test_a_system_message_mid_conversation_stays_in_place() -> None:
    # Claude Code sends its environment as a system message after the first user turn.
    doc = body()
    env = {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}
    doc["messages"].insert(1, env)
    parsed = parse_messages(doc)
    assert parsed.prompt.messages[1] == {"role": "system", "content": "# Environment"}  # type: ignore[union-attr]
