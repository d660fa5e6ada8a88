"""Requests to a backend of another API (docs/BACKENDS.md): an OpenAI client on an `anthropic`
backend and an Anthropic client on an `openai` backend, with the official clients. They go
through the event path (the backend kind's request, its answer read as internal events, the
client's surface rendering them). The upstreams are a second real mlxd (it speaks both APIs;
its forced tool calls are real ones) and a scripted app answering in each API's own format with
free tool calls (which the tiny random model never makes)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.e2e.conftest import Daemon, free_port, serving, start_daemon, stop_daemon

SYSTEM = "You are terse."
MESSAGES = [{"role": "user", "content": "hello there"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": SCHEMA}
PARIS = {"city": "Paris"}


@dataclass
class Scripted:
    """Answers in each API's format with text and a get_weather call; the stop reason is the
    request's user id (``metadata.user_id`` / ``user``), so a test picks it through the
    translation. Keeps every body it received."""

    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def messages(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        reason = (body.get("metadata") or {}).get("user_id", "tool_use")
        if body.get("stream"):
            return StreamingResponse(_anthropic_events(reason), media_type="text/event-stream")
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS}
        content = [{"type": "text", "text": "Let me look."}, use]
        return JSONResponse(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "tools",
                "content": content,
                "stop_reason": reason,
                "stop_sequence": None,
                "usage": {"input_tokens": 11, "output_tokens": 7},
            }
        )

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        reason = body.get("user", "tool_calls")
        if body.get("stream"):
            return StreamingResponse(_openai_chunks(reason), media_type="text/event-stream")
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(PARIS)},
        }
        message = {
            "role": "assistant",
            "content": "Let me look.",
            **({"tool_calls": [call]} if body.get("tools") else {}),
        }
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "tools",
                "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }
        )


async def _anthropic_events(reason: str) -> AsyncIterator[bytes]:
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "tools",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 1},
    }
    tool = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    events = [
        ("message_start", {"message": start}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Let me"}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " look."}}),
        ("content_block_stop", {"index": 0}),
        ("content_block_start", {"index": 1, "content_block": tool}),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"city": '}},
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'}},
        ),
        ("content_block_stop", {"index": 1}),
        (
            "message_delta",
            {
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        ),
        ("message_stop", {}),
    ]
    for name, data in events:
        yield f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


async def _openai_chunks(reason: str) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "tools",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    start = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me"}),
        chunk({"content": " look."}),
        chunk({"tool_calls": [start]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, reason),
        {
            **chunk({}),
            "choices": [],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        },
    ]
    for c in chunks:
        yield f"data: {json.dumps(c)}\n\n".encode()
    yield b"data: [DONE]\n\n"


@dataclass
class Setup:
    front: Daemon
    upstream: Daemon
    scripted: Scripted

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.front.base_url}/v1", api_key="x", max_retries=0)

    def anthropic(self, base_url: str | None = None) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=base_url or self.front.base_url, api_key="x", max_retries=0
        )


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Scripted, str]]:
    made = Scripted()
    routes = [
        Route("/v1/messages", made.messages, methods=["POST"]),
        Route("/v1/chat/completions", made.chat, methods=["POST"]),
    ]
    with serving(Starlette(routes=routes)) as url:
        yield made, url


@pytest.fixture(scope="module")
def setup(
    tiny_model: Path, scripted: tuple[Scripted, str], shared_daemon: Daemon
) -> Iterator[Setup]:
    made, url = scripted
    upstream = shared_daemon  # only sent requests: the session's daemon serves as the upstream
    front = start_daemon(
        tiny_model,
        "--max-context",
        "512",
        "--backend",
        f"ant=anthropic:{upstream.base_url}/v1",
        "--model",
        "claude=ant:tiny",
        "--backend",
        f"up=openai:{upstream.base_url}/v1",
        "--model",
        "gpt=up:tiny",
        "--backend",
        f"sant=anthropic:{url}",
        "--model",
        "sclaude=sant:tools",
        "--backend",
        f"soai=openai:{url}",
        "--model",
        "sgpt=soai:tools",
        "--backend",
        f"dead=openai:http://127.0.0.1:{free_port()}/v1",
        "--model",
        "deadgpt=dead:tiny",
        "--fallback",
        "deadgpt=gpt",
        "--backend",
        f"deadant=anthropic:http://127.0.0.1:{free_port()}/v1",
        "--model",
        "deadclaude=deadant:tiny",
        "--fallback",
        "deadclaude=claude",
    )
    yield Setup(front, upstream, made)
    if front.proc.poll() is None:
        stop_daemon(front)


def _direct_message(setup: Setup, **extra: Any) -> anthropic.types.Message:
    with setup.anthropic(setup.upstream.base_url) as client:
        return client.messages.create(
            model="tiny",
            max_tokens=8,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"temperature": 0},
            **extra,
        )


def _direct_chat(setup: Setup) -> openai.types.chat.ChatCompletion:
    messages = [{"role": "system", "content": SYSTEM}, *MESSAGES]
    with openai.OpenAI(base_url=f"{setup.upstream.base_url}/v1", api_key="x") as client:
        return client.chat.completions.create(
            model="tiny",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )


# An OpenAI client on an anthropic backend


def test_chat_reaches_an_anthropic_backend(setup: Setup) -> None:
    messages = [{"role": "system", "content": SYSTEM}, *MESSAGES]
    with setup.openai() as client:
        raw = client.chat.completions.with_raw_response.create(
            model="claude", messages=messages, max_tokens=8, temperature=0
        )  # type: ignore[arg-type]
    answer, direct = raw.parse(), _direct_message(setup, system=SYSTEM)
    assert raw.headers["x-mlxd-backend"] == "ant" and answer.model == "claude"
    assert answer.choices[0].message.content == direct.content[0].text  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "length" and direct.stop_reason == "max_tokens"
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert answer.usage.prompt_tokens == direct.usage.input_tokens > 0


def test_chat_stream_from_an_anthropic_backend(setup: Setup) -> None:
    messages = [{"role": "system", "content": SYSTEM}, *MESSAGES]
    with setup.openai() as client:
        chunks = list(
            client.chat.completions.create(
                model="claude",
                messages=messages,
                max_tokens=8,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )
        )
    direct = _direct_message(setup, system=SYSTEM)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {"claude"} and len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct.content[0].text  # type: ignore[union-attr]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["length"] and finishes[-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == direct.usage.input_tokens


def test_chat_stream_without_include_usage_has_no_usage_chunk(setup: Setup) -> None:
    with setup.openai() as client:
        chunks = list(
            client.chat.completions.create(
                model="claude", messages=MESSAGES, max_tokens=4, stream=True
            )
        )  # type: ignore[arg-type]
    assert all(c.choices and c.usage is None for c in chunks)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"seed": 1}, "seed"),
        ({"temperature": 1.5}, "temperature"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": ""}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
    ],
)
def test_chat_refuses_what_anthropic_cannot_do(
    setup: Setup, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "claude", "messages": MESSAGES, "max_tokens": 4, **extra}
    with setup.openai() as client, pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body)
    assert info.value.body["param"] == param  # type: ignore[index]
    assert param.removesuffix(".type") in info.value.message  # the content part, as locally


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "tool_calls"),  # a choice that made calls ends in tool_calls, as locally
        ("stop_sequence", "tool_calls"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
    ],
)
def test_chat_tool_call_from_an_anthropic_backend(setup: Setup, reason: str, finish: str) -> None:
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_0", "content": "sunny"},
        {"role": "user", "content": "and Paris?"},
    ]
    with setup.openai() as client:
        answer = client.chat.completions.create(
            model="sclaude",
            messages=history,
            tools=[{"type": "function", "function": WEATHER}],  # type: ignore[arg-type, list-item]
            tool_choice="required",
            user=reason,
            max_tokens=20,
        )
    sent = setup.scripted.bodies[-1]
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "description": WEATHER["description"],
            "input_schema": WEATHER["parameters"],
        }
    ]
    assert sent["tool_choice"] == {"type": "any"} and sent["max_tokens"] == 20
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Rome"}}
    ]
    assert sent["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"},
        {"type": "text", "text": "and Paris?"},
    ]
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == finish and message.content == "Let me look."
    (call,) = message.tool_calls or []
    assert call.id == "toolu_1" and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == PARIS  # type: ignore[union-attr]
    assert answer.usage is not None and (
        answer.usage.prompt_tokens,
        answer.usage.completion_tokens,
    ) == (11, 7)


def test_chat_streamed_tool_call_from_an_anthropic_backend(setup: Setup) -> None:
    with setup.openai() as client:
        chunks = list(
            client.chat.completions.create(
                model="sclaude",
                messages=MESSAGES,
                tools=[{"type": "function", "function": WEATHER}],  # type: ignore[arg-type, list-item]
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me look."
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert calls[0].id == "toolu_1" and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert [t.index for t in calls] == [0]  # each call whole, once complete, as locally
    assert json.loads("".join(t.function.arguments or "" for t in calls)) == PARIS  # type: ignore[union-attr]
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 18
    assert setup.scripted.bodies[-1]["tools"][0]["input_schema"] == WEATHER["parameters"]


# An Anthropic client on an openai backend


def test_messages_reach_an_openai_backend(setup: Setup) -> None:
    with setup.anthropic() as client:
        raw = client.messages.with_raw_response.create(
            model="gpt",
            max_tokens=8,
            system=SYSTEM,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"temperature": 0},
        )
    answer, direct = raw.parse(), _direct_chat(setup)
    assert raw.headers["x-mlxd-backend"] == "up" and answer.model == "gpt"
    assert answer.id.startswith("msg_") and answer.role == "assistant"
    assert answer.content[0].text == direct.choices[0].message.content  # type: ignore[union-attr]
    assert answer.stop_reason == "max_tokens" and direct.choices[0].finish_reason == "length"
    assert direct.usage is not None and answer.usage.output_tokens == 8
    assert answer.usage.input_tokens == direct.usage.prompt_tokens


def test_messages_stream_from_an_openai_backend(setup: Setup) -> None:
    with setup.anthropic() as client:
        events = list(
            client.messages.create(
                model="gpt",
                max_tokens=8,
                system=SYSTEM,
                messages=MESSAGES,
                stream=True,  # type: ignore[arg-type]
                extra_body={"temperature": 0},
            )
        )
    direct = _direct_chat(setup)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.model == "gpt"  # type: ignore[union-attr]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert text == direct.choices[0].message.content
    delta = events[-2]
    assert delta.delta.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert direct.usage is not None and delta.usage.output_tokens == 8  # type: ignore[union-attr]
    assert delta.usage.input_tokens == direct.usage.prompt_tokens  # type: ignore[union-attr]


def test_messages_refuse_top_k_for_an_openai_backend(setup: Setup) -> None:
    with setup.anthropic() as client, pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="gpt",
            max_tokens=8,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"top_k": 5},
        )
    assert "top_k" in info.value.message


@pytest.mark.parametrize(("finish", "reason"), [("stop", "end_turn"), ("length", "max_tokens")])
def test_messages_stop_reasons_from_an_openai_backend(
    setup: Setup, finish: str, reason: str
) -> None:
    with setup.anthropic() as client:
        answer = client.messages.create(
            model="sgpt",
            max_tokens=20,
            messages=MESSAGES,  # type: ignore[arg-type]
            metadata={"user_id": finish},
        )
    assert answer.stop_reason == reason and answer.stop_sequence is None
    assert [b.type for b in answer.content] == ["text"]


def test_messages_tool_call_from_an_openai_backend(setup: Setup) -> None:
    tool = {
        "name": "get_weather",
        "description": WEATHER["description"],
        "input_schema": WEATHER["parameters"],
    }
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_0",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"}],
        },
    ]
    with setup.anthropic() as client:
        answer = client.messages.create(
            model="sgpt",
            max_tokens=20,
            messages=history,  # type: ignore[arg-type]
            tools=[tool],
            tool_choice={"type": "any"},  # type: ignore[list-item]
            metadata={"user_id": "tool_calls"},
        )
    sent = setup.scripted.bodies[-1]
    assert sent["tools"] == [{"type": "function", "function": WEATHER}]
    assert sent["tool_choice"] == "required" and sent["user"] == "tool_calls"
    call = sent["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "toolu_0", "content": "sunny"}
    assert answer.stop_reason == "tool_use"
    text, use = answer.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == PARIS
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (11, 7)


def test_messages_streamed_tool_call_from_an_openai_backend(setup: Setup) -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER["parameters"]}
    with (
        setup.anthropic() as client,
        client.messages.stream(
            model="sgpt", max_tokens=20, messages=MESSAGES, tools=[tool]
        ) as stream,
    ):  # type: ignore[arg-type, list-item]
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert setup.scripted.bodies[-1]["stream_options"] == {"include_usage": True}
    assert kinds.count("content_block_start") == 2 and kinds.count("content_block_stop") == 2
    assert kinds[-2:] == ["message_delta", "message_stop"]
    text, use = final.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.id == "toolu_1" and use.input == PARIS
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 7)


# The event path with real upstreams: tool-call ids, usage, failover, a client leaving

UNIT = {
    "type": "object",
    "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
THERMOMETER = {"name": "get_temperature", "description": "The temperature", "parameters": UNIT}


def _direct_tool_use(setup: Setup) -> anthropic.types.Message:
    """The upstream mlxd's own forced tool call for the same conversation."""
    tool = {"name": "get_temperature", "description": "The temperature", "input_schema": UNIT}
    with setup.anthropic(setup.upstream.base_url) as client:
        return client.messages.create(
            model="tiny",
            max_tokens=60,
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},
        )


def _tool_request(stream: bool) -> dict[str, Any]:
    return {
        "model": "claude",
        "messages": MESSAGES,
        "tools": [{"type": "function", "function": THERMOMETER}],
        "tool_choice": "required",
        "max_tokens": 60,
        "temperature": 0,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def test_tool_calls_from_a_real_anthropic_upstream_keep_its_ids(setup: Setup) -> None:
    """The upstream mlxd's forced call comes back with its own ``toolu_`` id (the front would
    mint ``call_`` ids for calls it parsed itself), and the next turn sends it back up."""
    with setup.openai() as client:
        answer = client.chat.completions.create(**_tool_request(stream=False))
    direct = _direct_tool_use(setup)
    (call,) = answer.choices[0].message.tool_calls or []
    (use,) = direct.content
    assert use.type == "tool_use" and call.function.name == use.name == "get_temperature"  # type: ignore[union-attr]
    assert call.id.startswith("toolu_") and len(call.id) == len(use.id)
    assert json.loads(call.function.arguments) == use.input  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "tool_calls" and direct.stop_reason == "tool_use"
    assert answer.usage is not None and answer.usage.completion_tokens == direct.usage.output_tokens
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "21"},
    ]
    with setup.openai() as client:
        after = client.chat.completions.create(
            model="claude",
            messages=history,  # type: ignore[arg-type]
            tools=[{"type": "function", "function": THERMOMETER}],  # type: ignore[list-item]
            max_tokens=4,
        )
    assert after.choices[0].finish_reason == "length" and after.usage is not None


def test_streamed_tool_call_and_usage_from_a_real_anthropic_upstream(setup: Setup) -> None:
    with setup.openai() as client:
        chunks = list(client.chat.completions.create(**_tool_request(stream=True)))
    direct = _direct_tool_use(setup)
    (use,) = direct.content
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    (call,) = calls
    assert call.id is not None and call.id.startswith("toolu_")
    assert json.loads(call.function.arguments or "") == use.input  # type: ignore[union-attr]
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    usage = chunks[-1].usage
    prompt = direct.usage.input_tokens + (direct.usage.cache_read_input_tokens or 0)
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, direct.usage.output_tokens)
    metrics = httpx.get(f"{setup.front.base_url}/metrics").text
    assert 'mlxd_backend_requests_total{backend="ant",model="claude",outcome="ok"}' in metrics


@pytest.mark.parametrize("stream", [False, True])
def test_messages_fail_over_from_a_dead_upstream_to_a_live_one(setup: Setup, stream: bool) -> None:
    """``deadgpt``'s backend refuses connections: the request goes to ``gpt``, both of another
    API than the client's."""
    args: dict[str, Any] = {
        "model": "deadgpt",
        "max_tokens": 8,
        "system": SYSTEM,
        "messages": MESSAGES,
        "extra_body": {"temperature": 0},
    }
    with setup.anthropic() as client:
        if stream:
            with client.messages.stream(**args) as events:
                text = "".join(events.text_stream)
                final = events.get_final_message()
        else:
            raw = client.messages.with_raw_response.create(**args)
            final = raw.parse()
            text = final.content[0].text  # type: ignore[union-attr]
            assert raw.headers["x-mlxd-backend"] == "up"
    assert final.model == "gpt" and text == _direct_chat(setup).choices[0].message.content
    assert final.usage.output_tokens == 8
    metrics = httpx.get(f"{setup.front.base_url}/metrics").text
    assert 'mlxd_backend_failovers_total{from_model="deadgpt",to_model="gpt"}' in metrics


def test_chat_fails_over_from_a_dead_anthropic_upstream(setup: Setup) -> None:
    messages = [{"role": "system", "content": SYSTEM}, *MESSAGES]
    with setup.openai() as client:
        raw = client.chat.completions.with_raw_response.create(
            model="deadclaude", messages=messages, max_tokens=8, temperature=0
        )  # type: ignore[arg-type]
    answer = raw.parse()
    assert answer.model == "claude" and raw.headers["x-mlxd-backend"] == "ant"
    direct = _direct_message(setup, system=SYSTEM)
    assert answer.choices[0].message.content == direct.content[0].text  # type: ignore[union-attr]


def test_a_client_leaving_cancels_the_upstream_request(setup: Setup) -> None:
    """An Anthropic client of ``gpt`` (an ``openai`` backend) goes away after the first text:
    the front closes the upstream stream, and the upstream mlxd cancels the request far short
    of its tokens."""
    stats = "/admin/models/tiny/stats"
    before = setup.upstream.admin_get(stats).json()
    body = {
        "model": "gpt",
        "max_tokens": 400,
        "messages": MESSAGES,
        "stream": True,
        "temperature": 0,
    }
    url = f"{setup.front.base_url}/v1/messages"
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if "content_block_delta" in line)
    deadline = time.monotonic() + 15
    while (after := setup.upstream.admin_get(stats).json())["requests_cancelled"] == before[
        "requests_cancelled"
    ]:
        assert time.monotonic() < deadline, "the upstream request was never cancelled"
        time.sleep(0.2)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["output_tokens"] - before["output_tokens"] < 200
