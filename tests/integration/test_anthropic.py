"""The Anthropic Messages API through the official anthropic client, real uvicorn, real ZMQ."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import pytest
from scripted_worker import DEFAULT_REPLY, MODEL, TOOL_TOKENS, ScriptedWorker

from mlxd.config import ApiKey
from mlxd.protocol.messages import ChatPrompt

if TYPE_CHECKING:
    from conftest import Gateway

HELLO: Any = [{"role": "user", "content": "Say hello"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS: Any = [{"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}]
ASK: Any = [{"role": "user", "content": "TOOLCALL weather in Paris?"}]


@pytest.fixture
def claude(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        yield client


def test_message(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert [(b.type, getattr(b, "text", None)) for b in msg.content] == [("text", DEFAULT_REPLY)]
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.output_tokens == len(DEFAULT_REPLY.split())
    assert msg.usage.input_tokens == 2


def test_max_tokens_stop_reason(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=MODEL, max_tokens=3, messages=HELLO)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3


def test_stop_sequence_is_reported(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(
        model=MODEL, max_tokens=100, messages=HELLO, stop_sequences=["zzz", "worker"]
    )
    assert msg.content[0].text == "Hello from the scripted "  # type: ignore[union-attr]
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "worker")


@pytest.mark.parametrize("system", ["Be brief.", [{"type": "text", "text": "Be brief."}]])
def test_system_prompt_reaches_the_template(
    claude: anthropic.Anthropic, worker: ScriptedWorker, system: Any
) -> None:
    rid = f"sys-{type(system).__name__}"
    claude.messages.create(
        model=MODEL,
        max_tokens=5,
        messages=HELLO,
        system=system,
        extra_headers={"X-Request-Id": rid},
    )
    generate = worker.wait_generate(f"{rid}.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    assert generate.prompt.messages == [{"role": "system", "content": "Be brief."}, *HELLO]


def test_streaming_event_order(gateway: Gateway) -> None:
    body = {"model": MODEL, "max_tokens": 100, "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        names = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    deltas = names.count("content_block_delta")
    assert deltas >= 3
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_streaming_through_the_sdk(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=100, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == DEFAULT_REPLY
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(DEFAULT_REPLY.split()) and final.usage.input_tokens == 2


def test_tool_use(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=TOOLS)
    text, call = msg.content
    assert text.type == "text" and text.text == "Let me check. "
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert msg.stop_reason == "tool_use"


def test_tool_use_streamed(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=200, messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"


def test_tool_result_round_trip_reaches_the_template(
    claude: anthropic.Anthropic, worker: ScriptedWorker
) -> None:
    first = claude.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=TOOLS)
    call = first.content[1]
    history = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,  # type: ignore[union-attr]
                    "content": "sunny",
                }
            ],
        },
    ]
    claude.messages.create(
        model=MODEL,
        max_tokens=5,
        messages=history,
        tools=TOOLS,
        extra_headers={"X-Request-Id": "a-round"},
    )
    generate = worker.wait_generate("a-round.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    _, assistant, tool = generate.prompt.messages
    assert assistant["content"] == "Let me check. "
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert tool == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}  # type: ignore[union-attr]


def test_tool_choice_tool_forces_a_call(
    claude: anthropic.Anthropic, worker: ScriptedWorker
) -> None:
    forced: Any = [{"role": "user", "content": "JSONCALL"}]
    msg = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=TOOLS,
        messages=forced,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_headers={"X-Request-Id": "a-tc"},
    )
    assert [b.type for b in msg.content] == ["tool_use"] and msg.stop_reason == "tool_use"
    generate = worker.wait_generate("a-tc.")
    assert generate is not None and generate.sampling.response_format is not None


def test_count_tokens(claude: anthropic.Anthropic) -> None:
    plain = claude.messages.count_tokens(model=MODEL, messages=HELLO)
    tooled = claude.messages.count_tokens(model=MODEL, messages=HELLO, tools=TOOLS, system="x")
    assert plain.input_tokens == 2
    assert tooled.input_tokens == 3 + TOOL_TOKENS


BAD = [
    ({"model": MODEL, "messages": HELLO}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 5, "messages": HELLO, "temperature": 1.5}, "temperature"),
    (
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": HELLO,
            "thinking": {"type": "sometimes"},
        },
        "thinking.type",
    ),
    (
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
        "messages[0].content[0].source.type",
    ),
    (
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "audio", "source": {}}]}],
        },
        "messages[0].content[0].type",
    ),
    ({"model": MODEL, "max_tokens": 5, "messages": HELLO, "stop_sequences": "x"}, "stop_sequences"),
    ({"model": MODEL, "max_tokens": 5, "messages": HELLO, "frobnicate": 1}, "frobnicate"),
    ({"model": MODEL, "max_tokens": 5, "messages": HELLO, "container": "c1"}, "container"),
    (
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": HELLO,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "tools[0]",
    ),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_request_is_an_anthropic_400(gateway: Gateway, body: Any, field: str) -> None:
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert field in error["error"]["message"]


def test_errors_map_to_sdk_exceptions(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="nope", max_tokens=5, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as info:
        overload = [{"role": "user", "content": "ERROR:overloaded"}]
        claude.messages.create(model=MODEL, max_tokens=5, messages=overload)  # type: ignore[arg-type]
    assert info.value.response.headers["retry-after"] == "7"  # the worker's 6.2 s, rounded up
    assert info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_x_api_key_auth(make_gateway: Callable[..., Gateway]) -> None:
    keyed = make_gateway(api_keys=(ApiKey(name="claude", key="sk-claude-0123456789"),))
    with anthropic.Anthropic(
        base_url=keyed.url, api_key="sk-claude-0123456789", max_retries=0
    ) as good:
        assert good.messages.create(model=MODEL, max_tokens=2, messages=HELLO).content
    with anthropic.Anthropic(base_url=keyed.url, api_key="sk-wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model=MODEL, max_tokens=2, messages=HELLO)


def test_sampling_fields_and_metadata_reach_the_worker(
    claude: anthropic.Anthropic, worker: ScriptedWorker
) -> None:
    claude.messages.create(
        model=MODEL,
        max_tokens=7,
        messages=HELLO,
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 4},
        extra_headers={"X-Request-Id": "a-samp"},
    )
    generate = worker.wait_generate("a-samp.")
    assert generate is not None
    s = generate.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k) == (7, 0.5, 0.9, 4)


def test_disable_parallel_tool_use_keeps_one_call(claude: anthropic.Anthropic) -> None:
    twice: Any = [{"role": "user", "content": "TOOLCALL TOOLCALL"}]
    both = claude.messages.create(model=MODEL, max_tokens=300, messages=twice, tools=TOOLS)
    single: Any = {"type": "auto", "disable_parallel_tool_use": True}
    one = claude.messages.create(
        model=MODEL, max_tokens=300, messages=twice, tools=TOOLS, tool_choice=single
    )
    assert [b.type for b in both.content].count("tool_use") == 2
    assert [b.type for b in one.content].count("tool_use") == 1


def test_tool_choice_none_hides_the_tools(
    claude: anthropic.Anthropic, worker: ScriptedWorker
) -> None:
    msg = claude.messages.create(
        model=MODEL,
        max_tokens=300,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "none"},
        extra_headers={"X-Request-Id": "a-none"},
    )
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    generate = worker.wait_generate("a-none.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    assert generate.prompt.tools is None


def test_cache_control_is_accepted(claude: anthropic.Anthropic) -> None:
    blocks: Any = [{"type": "text", "text": "Say hello", "cache_control": {"type": "ephemeral"}}]
    msg = claude.messages.create(
        model=MODEL, max_tokens=100, system=blocks, messages=[{"role": "user", "content": blocks}]
    )
    assert msg.content[0].text == DEFAULT_REPLY  # type: ignore[union-attr]


def test_error_mid_stream_is_an_error_event(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "MIDERROR:overloaded"}],
    }
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=10) as response:
        lines = list(response.iter_lines())
    assert response.status_code == 200
    assert lines[-3:-1] == ["event: error", lines[-2]] and "overloaded_error" in lines[-2]
