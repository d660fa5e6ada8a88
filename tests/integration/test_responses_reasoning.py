"""Thinking on the Responses surface, through the official openai SDK: thinking text comes back
as ``reasoning`` items (whole and streamed as ``response.reasoning_text.*`` events), counted in
``output_tokens_details.reasoning_tokens``; stored responses and reasoning items sent back as
input replay it as the assistant turn's ``reasoning_content``; a tool call written inside
thinking is not a call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import openai
import pytest
from scripted_worker import (
    MODEL,
    THINK_CALL_REPLY,
    THINK_CALL_THOUGHT,
    THINK_REPLY,
    THINKING,
    THOUGHT_ANSWER,
    ScriptedWorker,
)

from mlxd.protocol.messages import ChatPrompt, Generate

if TYPE_CHECKING:
    from conftest import Gateway

TOOLS: Any = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
]


@pytest.fixture
def oai(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def thinking_tokens(reply: str, inside: bool) -> int:
    """The scripted worker's tokens (3-character pieces, one token each) through the one that
    closes thinking."""
    reply = reply.removeprefix("<think>") if inside else reply
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]
    end = reply.index("</think>") + len("</think>")
    return next(n for n in range(1, len(pieces) + 1) if len("".join(pieces[:n])) >= end)


def sent(worker: ScriptedWorker, rid: str) -> Generate:
    generate = worker.wait_generate(f"{rid}.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    return generate


@pytest.mark.parametrize("prompt", ["THINK", "THINKOPEN"])
def test_reasoning_item_then_message(oai: openai.OpenAI, prompt: str) -> None:
    response = oai.responses.create(model=MODEL, input=prompt)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content or []] == [("reasoning_text", THINKING)]
    assert message.type == "message" and response.output_text == THOUGHT_ANSWER
    assert response.usage is not None
    expected = thinking_tokens(THINK_REPLY, prompt == "THINKOPEN")
    assert response.usage.output_tokens_details.reasoning_tokens == expected
    assert 0 < expected < response.usage.output_tokens


def test_no_thinking_no_reasoning_item(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model=MODEL, input="hello")
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("prompt", ["THINK", "THINKOPEN"])
def test_streamed_reasoning_events(oai: openai.OpenAI, prompt: str) -> None:
    with oai.responses.stream(model=MODEL, input=prompt) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    first = kinds.index("response.output_item.added")
    assert kinds[first : first + 3] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    done = kinds.index("response.reasoning_text.done")
    assert set(kinds[first + 2 : done]) == {"response.reasoning_text.delta"}
    assert kinds[done + 1 : done + 4] == [
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the message, after the reasoning item
    ]
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(e.delta for e in deltas) == THINKING
    assert {(e.output_index, e.content_index) for e in deltas} == {(0, 0)}
    text_done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert text_done.text == THINKING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        THOUGHT_ANSWER
    )
    assert kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == THOUGHT_ANSWER
    assert final.usage is not None
    expected = thinking_tokens(THINK_REPLY, prompt == "THINKOPEN")
    assert final.usage.output_tokens_details.reasoning_tokens == expected
    items = [e.item for e in events if e.type == "response.output_item.done"]
    assert items[0].type == "reasoning"
    assert [(c.type, c.text) for c in items[0].content or []] == [("reasoning_text", THINKING)]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_inside_thinking_is_not_a_call(oai: openai.OpenAI, stream: bool) -> None:
    if stream:
        with oai.responses.stream(model=MODEL, input="THINKCALL", tools=TOOLS) as events:
            response = events.get_final_response()
    else:
        response = oai.responses.create(model=MODEL, input="THINKCALL", tools=TOOLS)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning, _, call = response.output
    assert reasoning.content is not None and reasoning.content[0].text == THINK_CALL_THOUGHT
    assert call.type == "function_call" and call.name == "get_weather"
    assert response.output_text.strip() == "Let me check."
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == thinking_tokens(
        THINK_CALL_REPLY, False
    )


def test_stored_reasoning_replays_as_reasoning_content(
    oai: openai.OpenAI, worker: ScriptedWorker
) -> None:
    first = oai.responses.create(model=MODEL, input="THINK")
    assert oai.responses.retrieve(first.id).output[0].type == "reasoning"
    oai.responses.create(
        model=MODEL,
        input="again",
        previous_response_id=first.id,
        extra_headers={"X-Request-Id": "rs-continued"},
    )
    messages = sent(worker, "rs-continued").prompt.messages  # type: ignore[union-attr]
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["reasoning_content"] == THINKING
    assert assistant["content"] == THOUGHT_ANSWER


def test_reasoning_items_sent_back_are_replayed(oai: openai.OpenAI, worker: ScriptedWorker) -> None:
    first = oai.responses.create(model=MODEL, input="THINK", store=False)
    history: Any = [
        {"role": "user", "content": "THINK"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "again"},
        # Another provider's reasoning item: encrypted, no text to replay.
        {"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": "opaque"},
        {"role": "assistant", "content": "ok"},
    ]
    oai.responses.create(
        model=MODEL, input=history, store=False, extra_headers={"X-Request-Id": "rs-replayed"}
    )
    messages = sent(worker, "rs-replayed").prompt.messages  # type: ignore[union-attr]
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert assistants[0]["reasoning_content"] == THINKING
    assert "reasoning_content" not in assistants[1]


def test_a_malformed_reasoning_item_is_a_400(oai: openai.OpenAI) -> None:
    bad: Any = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text"}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=MODEL, input=bad)
    assert "input[0].content[0].text" in str(caught.value)


def test_the_store_bounds_are_settings(make_gateway: Callable[..., Gateway]) -> None:
    small = make_gateway(max_stored_responses=1)
    with openai.OpenAI(base_url=f"{small.url}/v1", api_key="x", max_retries=0) as client:
        first = client.responses.create(model=MODEL, input="hello")
        second = client.responses.create(model=MODEL, input="hello")
        assert client.responses.retrieve(second.id).id == second.id
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first.id)  # evicted by the second
