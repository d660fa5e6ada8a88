"""The worker's Ping/Pong tool parser and CountTokens on the real tiny model's tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.protocol import codec
from mlxd.protocol.messages import (
    ChatPrompt,
    CountTokens,
    Error,
    Message,
    Ping,
    Pong,
    TokenCount,
    TokenPrompt,
)

pytestmark = pytest.mark.model

CHAT = [{"role": "user", "content": "hello there"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def ask(h: Any, msg: Message) -> Message:
    h.dealer.send_multipart(codec.encode(msg))
    for client, incoming in h.channel.recv_ready(timeout_ms=1000):
        h.engine.dispatch(client, incoming)
    assert h.dealer.poll(1000)
    return codec.decode(h.dealer.recv_multipart())


def test_pong_names_the_tool_parser(harness_factory: Any) -> None:
    pong = ask(harness_factory(), Ping(request_id="p"))
    assert isinstance(pong, Pong) and pong.tool_parser == "json_tools"


def test_count_tokens_applies_the_template_and_tools(harness_factory: Any) -> None:
    h = harness_factory()
    plain = ask(h, CountTokens(request_id="a", prompt=ChatPrompt(messages=CHAT)))
    tooled = ask(h, CountTokens(request_id="b", prompt=ChatPrompt(messages=CHAT, tools=TOOLS)))
    assert isinstance(plain, TokenCount) and isinstance(tooled, TokenCount)
    assert plain.num_tokens == len(h.engine.encoder.encode(ChatPrompt(messages=CHAT)))
    assert tooled.num_tokens > plain.num_tokens + 20
    assert not h.engine.scheduler.has_work()  # counting ran nothing


def test_count_tokens_of_a_bad_prompt_is_an_error(harness_factory: Any) -> None:
    reply = ask(
        harness_factory(), CountTokens(request_id="c", prompt=TokenPrompt(token_ids=[10**9]))
    )
    assert isinstance(reply, Error) and reply.code == "invalid_request"
