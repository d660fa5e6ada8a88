"""Extended thinking on the Anthropic surface, through the official anthropic client: the switch
and budget reach the worker, thinking text comes back as thinking blocks (streamed and not),
replayed thinking blocks and ``context_management`` shape the prompt, and the field rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import pytest
from scripted_worker import MODEL, THINKING, THOUGHT_ANSWER, ScriptedWorker

from mlxd.protocol.messages import ChatPrompt, Generate

if TYPE_CHECKING:
    from conftest import Gateway

THINK: Any = [{"role": "user", "content": "THINK please"}]
ENABLED: Any = {"type": "enabled", "budget_tokens": 1024}
CLEAR_ONE: Any = {
    "edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
}


@pytest.fixture
def claude(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        yield client


def sent(worker: ScriptedWorker, rid: str) -> Generate:
    generate = worker.wait_generate(f"{rid}.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    return generate


def turn(thought: str, text: str) -> dict[str, Any]:
    """An assistant turn as a client sends it back: a thinking block, then text."""
    block = {"type": "thinking", "thinking": thought, "signature": "sig"}
    return {"role": "assistant", "content": [block, {"type": "text", "text": text}]}


@pytest.mark.parametrize("prompt", ["THINK", "THINKOPEN"])
def test_thinking_block_then_text(claude: anthropic.Anthropic, prompt: str) -> None:
    ask: Any = [{"role": "user", "content": prompt}]
    msg = claude.messages.create(model=MODEL, max_tokens=100, messages=ask, thinking=ENABLED)
    thought, text = msg.content
    assert thought.type == "thinking" and thought.thinking == THINKING
    assert thought.signature.startswith("mlxd-")
    assert text.type == "text" and text.text == THOUGHT_ANSWER


@pytest.mark.parametrize("prompt", ["THINK", "THINKOPEN"])
def test_thinking_streams_as_thinking_blocks(claude: anthropic.Anthropic, prompt: str) -> None:
    ask: Any = [{"role": "user", "content": prompt}]
    with claude.messages.stream(
        model=MODEL, max_tokens=100, messages=ask, thinking=ENABLED
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    thinking = "".join(e.thinking for e in events if e.type == "thinking")
    assert thinking == THINKING
    assert "".join(e.text for e in events if e.type == "text") == THOUGHT_ANSWER
    signature = kinds.index("signature")
    assert kinds[signature + 1] == "content_block_stop"  # the signature closes the block
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature.startswith("mlxd-")  # type: ignore[union-attr]


def test_streamed_event_order(gateway: Gateway) -> None:
    body = {"model": MODEL, "max_tokens": 100, "messages": THINK, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=10) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    events = [line.split('"type":"', 2) for line in lines]
    starts = [e[2].split('"')[0] for e in events if e[1].startswith("content_block_start")]
    deltas = [e[2].split('"')[0] for e in events if e[1].startswith("content_block_delta")]
    assert starts == ["thinking", "text"]
    first_text = deltas.index("text_delta")
    assert set(deltas[: first_text - 1]) == {"thinking_delta"}
    assert deltas[first_text - 1] == "signature_delta"


@pytest.mark.parametrize(
    ("thinking", "switch", "budget"),
    [
        (ENABLED, True, 1024),
        ({"type": "enabled", "budget_tokens": 31999}, True, 31999),  # over max_tokens: fine
        ({"type": "adaptive"}, True, None),
        ({"type": "disabled"}, False, None),
        (None, False, None),
    ],
)
def test_the_switch_and_budget_reach_the_worker(
    claude: anthropic.Anthropic,
    worker: ScriptedWorker,
    thinking: Any,
    switch: bool,
    budget: int | None,
) -> None:
    rid = f"switch-{thinking and thinking['type']}-{budget}"
    extra = {} if thinking is None else {"thinking": thinking}
    claude.messages.create(
        model=MODEL, max_tokens=100, messages=THINK, extra_headers={"X-Request-Id": rid}, **extra
    )
    generate = sent(worker, rid)
    assert generate.prompt.thinking is switch  # type: ignore[union-attr]
    assert generate.sampling.thinking_budget == budget


def test_replayed_thinking_becomes_reasoning_content(
    claude: anthropic.Anthropic, worker: ScriptedWorker
) -> None:
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    history: Any = [
        {"role": "user", "content": "hi"},
        turn("first thought", "one"),
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": [redacted, {"type": "text", "text": "two"}]},
        {"role": "user", "content": "THINK"},
    ]
    claude.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=history,
        thinking=ENABLED,
        extra_headers={"X-Request-Id": "replay"},
    )
    messages = sent(worker, "replay").prompt.messages  # type: ignore[union-attr]
    assert messages[1] == {
        "role": "assistant",
        "content": "one",
        "reasoning_content": "first thought",
    }
    assert messages[3] == {"role": "assistant", "content": "two"}  # redacted: nothing to read


def test_clear_thinking_keeps_the_last_turns(gateway: Gateway, worker: ScriptedWorker) -> None:
    history: Any = [
        {"role": "user", "content": "hi"},
        turn("old thought", "one"),
        {"role": "user", "content": "again"},
        turn("new thought", "two"),
        {"role": "user", "content": "THINK"},
    ]
    with anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        msg = client.beta.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=history,
            thinking=ENABLED,
            context_management=CLEAR_ONE,
            betas=["context-management-2025-06-27"],
            extra_headers={"X-Request-Id": "clear"},
        )
    messages = sent(worker, "clear").prompt.messages  # type: ignore[union-attr]
    assert "reasoning_content" not in messages[1]
    assert messages[3]["reasoning_content"] == "new thought"
    assert msg.context_management is not None
    (edit,) = msg.context_management.applied_edits
    assert edit.type == "clear_thinking_20251015" and edit.cleared_thinking_turns == 1


def test_clear_thinking_reported_in_the_stream(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 100,
        "messages": THINK,
        "stream": True,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=10) as response:
        deltas = [line for line in response.iter_lines() if '"message_delta"' in line]
    assert response.status_code == 200
    assert (
        '"applied_edits":[{"type":"clear_thinking_20251015","cleared_thinking_turns":0'
        in (deltas[0])
    )


BAD = [
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    (
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        "clear_tool_uses_20250919",
    ),
    (
        {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": 2}]}},
        "context_management.edits[0].keep",
    ),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
]


@pytest.mark.parametrize(("extra", "field"), BAD)
def test_bad_thinking_fields_are_a_400_naming_them(
    gateway: Gateway, extra: dict[str, Any], field: str
) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": THINK, **extra}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert field in response.json()["error"]["message"]


def test_a_user_thinking_block_is_refused(gateway: Gateway) -> None:
    content = [{"type": "thinking", "thinking": "x", "signature": "s"}]
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=10)
    assert response.status_code == 400 and "messages[0].content[0].type" in response.text


def test_server_side_fields_betas_and_the_beta_query_are_accepted(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": THINK,
        "metadata": {"user_id": "user_abc_account_123"},
        "service_tier": "auto",
        "inference_geo": "us",
        "speed": "fast",
        "output_config": {"effort": "high"},
        "cache_control": {"type": "ephemeral"},
    }
    headers = {"anthropic-beta": "interleaved-thinking-2025-05-14,no-such-beta-2099-01-01"}
    response = httpx.post(
        f"{gateway.url}/v1/messages?beta=true", json=body, headers=headers, timeout=10
    )
    assert response.status_code == 200, response.text


def test_count_tokens_accepts_the_thinking_fields(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "messages": [*THINK, turn("t", "x"), *THINK],
        "thinking": ENABLED,
        "context_management": CLEAR_ONE,
    }
    response = httpx.post(f"{gateway.url}/v1/messages/count_tokens?beta=true", json=body)
    assert response.status_code == 200, response.text
