"""Tool calls on the Ollama API through the official ``ollama`` client: the scripted worker
writes text then a ``<tool_call>`` (its tags split across deltas), and ``message.tool_calls``
carries the parsed call, streamed and whole, with the text before it as ``content``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import ollama
import pytest
from scripted_worker import MODEL

if TYPE_CHECKING:
    from conftest import Gateway

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK: Any = [{"role": "user", "content": "TOOLCALL"}]


@pytest.fixture
def client(gateway: Gateway) -> Iterator[ollama.Client]:
    with ollama.Client(host=gateway.url, timeout=10) as c:
        yield c


def test_a_tool_call_comes_back_whole(client: ollama.Client) -> None:
    out = client.chat(model=MODEL, messages=ASK, tools=TOOLS)
    calls = out.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert (out.message.content or "").strip() == "Let me check."
    assert out.done and out.done_reason == "stop"


def test_a_tool_call_comes_back_streamed(client: ollama.Client) -> None:
    parts = list(client.chat(model=MODEL, messages=ASK, tools=TOOLS, stream=True))
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    text = "".join(p.message.content or "" for p in parts)
    assert "<tool_call>" not in text and text.strip() == "Let me check."
    assert parts[-1].done


@pytest.mark.parametrize("stream", [False, True])
def test_without_tools_the_markup_is_text(client: ollama.Client, stream: bool) -> None:
    if stream:
        text = "".join(p.message.content or "" for p in client.chat(MODEL, ASK, stream=True))
    else:
        text = client.chat(model=MODEL, messages=ASK).message.content or ""
    assert "<tool_call>" in text  # no tools offered: nothing is parsed out
