"""The Anthropic Messages API on the real tiny model through the official anthropic client."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MESSAGES: Any = [{"role": "user", "content": "Tell me about the python standard library"}]
TOOLS: Any = [
    {
        "name": "get_weather",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 6}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]


def claude(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)


def test_message_text_equals_the_chat_completion(daemon: Daemon) -> None:
    with claude(daemon) as c:
        msg = c.messages.create(
            model=daemon.model,
            max_tokens=12,
            messages=MESSAGES,
            system="You are terse.",
            extra_body={"temperature": 0},
        )
    chat = client(daemon).chat.completions.create(
        model=daemon.model,
        max_tokens=12,
        temperature=0,
        messages=[{"role": "system", "content": "You are terse."}, *MESSAGES],
    )
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == chat.choices[0].message.content
    # Anthropic's input_tokens leaves out the prompt tokens read from the prefix cache
    assert prompt_tokens(msg.usage) == chat.usage.prompt_tokens  # type: ignore[union-attr]


def prompt_tokens(usage: Any) -> int:
    return int(usage.input_tokens + (usage.cache_read_input_tokens or 0))


def test_count_tokens_matches_the_prompt_tokens(daemon: Daemon) -> None:
    with claude(daemon) as c:
        counted = c.messages.count_tokens(model=daemon.model, messages=MESSAGES, tools=TOOLS)
        msg = c.messages.create(model=daemon.model, max_tokens=1, messages=MESSAGES, tools=TOOLS)
    assert counted.input_tokens == prompt_tokens(msg.usage) > 30


def test_streamed_forced_tool_use_on_a_random_model(daemon: Daemon) -> None:
    with (
        claude(daemon) as c,
        c.messages.stream(
            model=daemon.model,
            max_tokens=60,
            messages=MESSAGES,
            tools=TOOLS,
            extra_body={"temperature": 0},
            tool_choice={"type": "tool", "name": "get_weather"},
        ) as stream,
    ):
        starts = [e.message.usage for e in stream if e.type == "message_start"]
        final = stream.get_final_message()
    # message_start already reports the prompt's tokens, as Anthropic's API does
    assert len(starts) == 1 and prompt_tokens(starts[0]) == prompt_tokens(final.usage)
    assert [b.type for b in final.content] == ["tool_use"]
    assert set(final.content[0].input) == {"city"}  # type: ignore[union-attr, arg-type]
    assert final.stop_reason == "tool_use" and prompt_tokens(final.usage) > 30
