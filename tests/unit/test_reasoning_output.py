"""The rules of thinking output on the OpenAI surfaces: how thinking tokens are counted, when
chat splits thinking (``reasoning_effort``), chat chunks with ``reasoning_content``, and
Responses reasoning items as output and as replayed input."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.openai import schemas
from mlxd.gateway.surfaces.openai.chunks import ChatChunks
from mlxd.gateway.surfaces.responses.body import output_items
from mlxd.gateway.surfaces.responses.items import input_items, to_messages
from mlxd.gateway.tools.calls import ToolCall
from mlxd.gateway.tools.reasoning import ReasoningSplitter
from mlxd.protocol.messages import Finished, Thinking, TokenDelta, Usage

THINK = Thinking(start="<think>", end="</think>")
OPENED = Thinking(start="<think>", end="</think>", inside=True)
HELLO: Any = [{"role": "user", "content": "hi"}]


def deltas(pieces: list[str], marks: Thinking | None) -> list[TokenDelta]:
    """One delta per piece, of as many tokens as the piece has characters."""
    return [
        TokenDelta(
            request_id="r",
            text=p,
            token_ids=list(range(len(p))),
            thinking=marks if i == 0 else None,
        )
        for i, p in enumerate(pieces)
    ]


def counted(pieces: list[str], marks: Thinking | None = THINK) -> int:
    splitter = ReasoningSplitter()
    for delta in deltas(pieces, marks):
        splitter.delta(delta)
    return splitter.tokens


# Counting thinking tokens


def test_tokens_through_the_closing_marker() -> None:
    assert counted(["<think>", "ab", "</think>", "answer"]) == len("<think>ab</think>")


def test_a_held_back_opening_marker_counts_once_seen() -> None:
    assert counted(["<th", "ink>", "ab", "</think>", "x"]) == len("<think>ab</think>")


def test_output_opened_inside_thinking() -> None:
    assert counted(["ab", "</think>", "answer"], OPENED) == len("ab</think>")


def test_no_thinking_no_tokens() -> None:
    assert counted(["<th", "e answer"]) == 0  # held back, then not a marker
    assert counted(["<think>", "ab", "</think>"], None) == 0  # the model marks no thinking


def test_tokens_after_the_answer_began_are_not_thinking() -> None:
    assert counted(["answer", " ", "<think>"]) == len("<think>")  # a late one counts alone


# Chat: reasoning_effort


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": HELLO, **fields}


@pytest.mark.parametrize(("effort", "switch"), [("none", False), ("low", True), ("xhigh", True)])
def test_reasoning_effort_switches_and_splits(effort: str, switch: bool) -> None:
    parsed = schemas.parse_chat(chat(reasoning_effort=effort))
    assert parsed.reasoning is True
    assert parsed.prompt.thinking is switch  # type: ignore[union-attr]


def test_without_reasoning_effort_nothing_is_split() -> None:
    parsed = schemas.parse_chat(chat())
    assert parsed.reasoning is False and parsed.prompt.thinking is None  # type: ignore[union-attr]
    assert parsed.new_reasoning_splitter() is None


@pytest.mark.parametrize("effort", ["max", 3, True])
def test_a_bad_reasoning_effort_is_refused(effort: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        schemas.parse_chat(chat(reasoning_effort=effort))
    assert caught.value.param == "reasoning_effort"


def test_completions_refuse_reasoning_effort() -> None:
    with pytest.raises(InvalidRequest):
        schemas.parse_completion({"model": "m", "prompt": "x", "reasoning_effort": "low"})


# Chat chunks


def chunks_of(pieces: list[str], include_usage: bool = True) -> list[dict[str, Any]]:
    fmt = ChatChunks("c", "m", 0, 1, include_usage, None, ReasoningSplitter)
    assert fmt.text_frame(0, "x") is None  # nothing goes out unsplit
    out = [c for d in deltas(pieces, THINK) for c in fmt.token_delta(0, d)]
    out += fmt.finish(
        0,
        Finished(
            request_id="r", finish_reason="stop", usage=Usage(prompt_tokens=0, completion_tokens=0)
        ),
    )
    return out + fmt.tail(Usage(prompt_tokens=3, completion_tokens=30))


def test_chunks_carry_reasoning_content_then_content() -> None:
    out = chunks_of(["<think>\n", "plan", "\n</think>\n\n", "Hi", "."])
    choices = [c["choices"][0] for c in out if c["choices"]]
    fields = [next(iter(c["delta"].items())) for c in choices if c["delta"]]
    assert fields == [("reasoning_content", "plan"), ("content", "Hi"), ("content", ".")]
    assert choices[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    details = out[-1]["usage"]["completion_tokens_details"]
    assert details == {"reasoning_tokens": len("<think>\nplan\n</think>\n\n")}


def test_text_frames_stay_fast_when_nothing_is_split() -> None:
    fmt = ChatChunks("c", "m", 0, 1, False, None, lambda: None)
    assert fmt.text_frame(0, "x") is not None


# Responses items


def test_output_items_put_reasoning_first() -> None:
    call = ToolCall(id="call_1", name="f", arguments="{}")
    items = output_items("", [call], frozenset(), "thought")
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[0]["id"].startswith("rs_")
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "thought"}]
    assert items[0]["summary"] == []
    assert [i["type"] for i in output_items("hi", [], frozenset())] == ["message"]


def test_reasoning_items_become_the_next_assistant_turns_reasoning_content() -> None:
    items = input_items(
        [
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "a"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            {"role": "assistant", "content": "done"},
        ]
    )
    messages = to_messages(items, set())
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["reasoning_content"] == "a"
    assert "reasoning_content" not in messages[3]  # a summary is not the thinking


def test_reasoning_before_a_user_turn_is_dropped() -> None:
    items = input_items(
        [
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "a"}],
            },
            {"role": "user", "content": "q"},
        ]
    )
    assert to_messages(items, set()) == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("content", "param"),
    [
        ("x", "input[0].content"),
        ([1], "input[0].content[0]"),
        ([{"type": "reasoning_text"}], "input[0].content[0].text"),
    ],
)
def test_malformed_reasoning_items_are_refused(content: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        input_items([{"type": "reasoning", "summary": [], "content": content}])
    assert caught.value.param == param
