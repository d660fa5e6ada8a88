"""Thinking on the OpenAI chat surface, through the official openai SDK: ``reasoning_effort``
switches the template's thinking and splits it out as ``reasoning_content`` (whole and
``delta.reasoning_content`` streamed), counted in ``completion_tokens_details``; a request
without it is answered as before. And on every surface, thinking is split before tool calls are
looked for: a ``<tool_call>`` written inside thinking is not a call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
from scripted_worker import (
    MODEL,
    THINK_CALL_THOUGHT,
    THINK_REPLY,
    THINKING,
    THOUGHT_ANSWER,
    ScriptedWorker,
)

from mlxd.protocol.messages import ChatPrompt, Generate

if TYPE_CHECKING:
    from conftest import Gateway

THINK: Any = [{"role": "user", "content": "THINK"}]
THINKCALL: Any = [{"role": "user", "content": "THINKCALL"}]
TOOLS: Any = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]


@pytest.fixture
def claude(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        yield client


def thinking_tokens(reply: str) -> int:
    """The scripted worker's tokens (3-character pieces) through the one closing thinking."""
    end = reply.index("</think>") + len("</think>")
    return -(-end // 3)


def sent(worker: ScriptedWorker, rid: str) -> Generate:
    generate = worker.wait_generate(f"{rid}.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    return generate


def test_reasoning_content_whole(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=THINK, reasoning_effort="high")
    message = out.choices[0].message
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == THINKING
    assert message.content == THOUGHT_ANSWER
    assert out.usage is not None and out.usage.completion_tokens_details is not None
    assert out.usage.completion_tokens_details.reasoning_tokens == thinking_tokens(THINK_REPLY)


def test_reasoning_content_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=THINK,
            reasoning_effort="low",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thoughts = [(d.model_extra or {}).get("reasoning_content") for d in deltas]
    assert "".join(t for t in thoughts if t) == THINKING
    assert "".join(d.content or "" for d in deltas) == THOUGHT_ANSWER
    last_thought = max(i for i, t in enumerate(thoughts) if t)
    first_text = min(i for i, d in enumerate(deltas) if d.content)
    assert last_thought < first_text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == thinking_tokens(THINK_REPLY)


def test_without_reasoning_effort_nothing_changes(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": THINK}
    out = http.post("/v1/chat/completions", json=body).json()
    message = out["choices"][0]["message"]
    assert message["content"] == THINK_REPLY
    assert "reasoning_content" not in message
    assert "completion_tokens_details" not in out["usage"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert "reasoning_content" not in "".join(lines)


@pytest.mark.parametrize(("effort", "switch"), [("none", False), ("medium", True)])
def test_reasoning_effort_is_the_switch(
    client: openai.OpenAI, worker: ScriptedWorker, effort: Any, switch: bool
) -> None:
    rid = f"effort-{effort}"
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        reasoning_effort=effort,
        extra_headers={"X-Request-Id": rid},
    )
    assert sent(worker, rid).prompt.thinking is switch  # type: ignore[union-attr]


def test_a_bad_reasoning_effort_is_a_400(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": THINK, "reasoning_effort": "max"}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "reasoning_effort"
    completion = {"model": MODEL, "prompt": "x", "reasoning_effort": "low"}
    assert http.post("/v1/completions", json=completion).status_code == 400


# A tool call written inside thinking, on every surface


@pytest.mark.parametrize("stream", [False, True])
def test_chat_call_inside_thinking(client: openai.OpenAI, stream: bool) -> None:
    args: Any = {"model": MODEL, "messages": THINKCALL, "tools": TOOLS, "reasoning_effort": "high"}
    if stream:
        deltas = [
            c.choices[0].delta
            for c in client.chat.completions.create(**args, stream=True)
            if c.choices
        ]
        thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        names = [c.function.name for d in deltas for c in d.tool_calls or [] if c.function]
    else:
        message = client.chat.completions.create(**args).choices[0].message
        thought = (message.model_extra or {})["reasoning_content"]
        names = [c.function.name for c in message.tool_calls or []]  # type: ignore[union-attr]
    assert thought == THINK_CALL_THOUGHT
    assert names == ["get_weather"]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_call_inside_thinking(claude: anthropic.Anthropic, stream: bool) -> None:
    tools: Any = [
        {"name": n, "input_schema": {"type": "object"}} for n in ("get_weather", "get_time")
    ]
    args: Any = {"model": MODEL, "max_tokens": 500, "messages": THINKCALL, "tools": tools}
    if stream:
        with claude.messages.stream(**args) as events:
            message = events.get_final_message()
    else:
        message = claude.messages.create(**args)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == THINK_CALL_THOUGHT  # type: ignore[union-attr]
    assert message.content[2].name == "get_weather"  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_call_inside_thinking(http: httpx.Client, stream: bool) -> None:
    body = {"model": MODEL, "messages": THINKCALL, "tools": TOOLS, "think": True, "stream": stream}
    with http.stream("POST", "/api/chat", json=body) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    messages = [line["message"] for line in lines]
    thought = "".join(m.get("thinking") or "" for m in messages)
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert thought == THINK_CALL_THOUGHT
    assert calls == ["get_weather"]
