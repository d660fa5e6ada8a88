"""Tool calls through the official client: parsed from the worker's text, streamed and not."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import openai
import pytest
from scripted_worker import MODEL, ScriptedWorker

from mlxd.protocol.messages import ChatPrompt

if TYPE_CHECKING:
    from conftest import Gateway

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "TOOLCALL weather in Paris?"}]


def test_tool_call_non_streamed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_tool_call_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    content, calls, finish = "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check. " and finish == "tool_calls"
    (call,) = calls
    assert (call.index, call.function.name) == (0, "get_weather")  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr, arg-type]


def test_without_tools_the_text_is_content(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK)  # type: ignore[arg-type]
    assert reply.choices[0].message.tool_calls is None
    assert "<tool_call>" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"


def test_tool_choice_none_hides_the_tools(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        extra_headers={"X-Request-Id": "tc-none"},
    )
    assert reply.choices[0].message.tool_calls is None
    generate = worker.wait_generate("tc-none.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    assert generate.prompt.tools is None


def test_tool_round_trip_messages_reach_the_template(
    client: openai.OpenAI, worker: ScriptedWorker
) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    call = (first.choices[0].message.tool_calls or [])[0]
    # The response message object itself goes back in, as agents do (null refusal included).
    history = [
        *ASK,
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    client.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "tc-round"},
    )
    generate = worker.wait_generate("tc-round.")
    assert generate is not None and isinstance(generate.prompt, ChatPrompt)
    assistant, tool = generate.prompt.messages[1:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": call.id}


def test_parallel_tool_calls_false_keeps_one(client: openai.OpenAI) -> None:
    twice = [{"role": "user", "content": "TOOLCALL TOOLCALL"}]
    both = client.chat.completions.create(model=MODEL, messages=twice, tools=TOOLS)  # type: ignore[arg-type]
    assert len(both.choices[0].message.tool_calls or []) == 2
    one = client.chat.completions.create(
        model=MODEL,
        messages=twice,
        tools=TOOLS,
        n=2,  # type: ignore[arg-type]
        parallel_tool_calls=False,
    )
    assert [len(c.message.tool_calls or []) for c in one.choices] == [1, 1]


def test_streamed_calls_are_indexed(client: openai.OpenAI) -> None:
    twice = [{"role": "user", "content": "TOOLCALL TOOLCALL"}]
    stream = client.chat.completions.create(model=MODEL, messages=twice, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    calls = [c for chunk in stream for c in chunk.choices[0].delta.tool_calls or []]  # type: ignore[union-attr]
    assert [c.index for c in calls] == [0, 1] and len({c.id for c in calls}) == 2


def test_named_tool_choice_constrains_and_parses_the_whole_output(
    client: openai.OpenAI, worker: ScriptedWorker
) -> None:
    forced = [{"role": "user", "content": "JSONCALL weather?"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=forced,
        tools=TOOLS,
        extra_headers={"X-Request-Id": "tc-named"},  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.choices[0].message.content is None
    assert reply.choices[0].finish_reason == "tool_calls"
    generate = worker.wait_generate("tc-named.")
    assert generate is not None and generate.sampling.response_format is not None
    schema = json.loads(generate.sampling.response_format.schema or "")
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == TOOLS[0]["function"]["parameters"]  # type: ignore[index]


def test_required_tool_choice_streamed(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    tools = [*TOOLS, {"type": "function", "function": {"name": "get_time"}}]
    forced = [{"role": "user", "content": "JSONCALL weather?"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=forced,
        tools=tools,
        tool_choice="required",
        stream=True,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "tc-required"},
    )
    chunks = list(stream)
    calls = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    generate = worker.wait_generate("tc-required.")
    assert generate is not None and generate.sampling.response_format is not None
    schema = json.loads(generate.sampling.response_format.schema or "")
    names = [s["properties"]["name"]["const"] for s in schema["anyOf"]]
    assert names == ["get_weather", "get_time"]


QWEN3_CODER_REPLY = (
    "On it. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def coder_gateway(
    tmp_path_factory: pytest.TempPathFactory, make_gateway: Callable[..., Gateway]
) -> Iterator[Gateway]:
    """A worker whose model uses mlx-lm's qwen3_coder tool parser (its Pong says so)."""
    endpoint = f"ipc://{tmp_path_factory.mktemp('coder')}/w.sock"
    coder = ScriptedWorker(endpoint, reply=QWEN3_CODER_REPLY, tool_parser="qwen3_coder")
    coder.start()
    yield make_gateway(endpoint)
    coder.stop()


def test_the_workers_tool_parser_is_used(coder_gateway: Gateway) -> None:
    with openai.OpenAI(base_url=f"{coder_gateway.url}/v1", api_key="x", max_retries=0) as c:
        ask = [{"role": "user", "content": "weather in Paris?"}]  # the worker's reply, no trigger
        whole = c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS)  # type: ignore[arg-type]
        chunks = list(
            c.chat.completions.create(
                model=MODEL,
                messages=ask,
                tools=TOOLS,  # type: ignore[arg-type]
                stream=True,
            )
        )
    assert whole.choices[0].message.content == "On it. "
    (call,) = whole.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    streamed = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
    assert [t.function.name for t in streamed] == ["get_weather"]  # type: ignore[union-attr]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "On it. "
