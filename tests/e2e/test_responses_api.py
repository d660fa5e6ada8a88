"""The OpenAI Responses API (/v1/responses) end to end: a real daemon on the tiny random model,
real HTTP, the official openai client's ``responses`` resource (create, stream, retrieve,
input_items, delete), compared with the same conversation through /v1/chat/completions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

QUESTION = "Tell me about the python standard library"
INSTRUCTIONS = "You are terse. Answer in one short sentence, and never apologise for anything."
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "ok"],
    "additionalProperties": False,
}
JSON_FORMAT: Any = {
    "format": {"type": "json_schema", "name": "p", "schema": SCHEMA, "strict": True}
}


@pytest.fixture
def daemon(shared_daemon: Daemon) -> Daemon:
    return shared_daemon


def chat_text(daemon: Daemon, messages: list[dict[str, Any]], max_tokens: int, **kw: Any) -> str:
    resp = client(daemon).chat.completions.create(
        model=daemon.model, messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )
    return resp.choices[0].message.content or ""


def test_create_plain(daemon: Daemon) -> None:
    resp = client(daemon).responses.create(model=daemon.model, input=QUESTION, max_output_tokens=8)
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status in ("completed", "incomplete") and resp.model == daemon.model
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text and resp.usage is not None
    assert resp.usage.output_tokens <= 8 and resp.usage.input_tokens > 5
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


def test_greedy_text_with_instructions_equals_the_chat_completion(daemon: Daemon) -> None:
    resp = client(daemon).responses.create(
        model=daemon.model,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=12,
        temperature=0,
    )
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    assert resp.output_text == chat_text(daemon, messages, 12)
    assert resp.instructions == INSTRUCTIONS and resp.temperature == 0
    if resp.usage is not None and resp.usage.output_tokens == 12:  # cut by max_output_tokens
        assert resp.status == "incomplete"
        assert resp.incomplete_details and resp.incomplete_details.reason == "max_output_tokens"


def test_function_tool_round_trip(daemon: Daemon) -> None:
    """tool_choice forces the call (constrained decoding: a random model writes no call on its
    own); its output goes back as function_call_output, and the next answer is the chat
    completion of the same conversation. The web_search tool is dropped, and says so."""
    tools: Any = [WEATHER, {"type": "web_search"}]
    raw = client(daemon).responses.with_raw_response.create(
        model=daemon.model,
        input=QUESTION,
        tools=tools,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    assert raw.headers["x-mlxd-dropped-tools"] == "web_search"
    first = raw.parse()
    assert [item.type for item in first.output] == ["function_call"]
    call: Any = first.output[0]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    assert call.call_id.startswith("call_") and first.status == "completed"
    result = '{"temperature_c": 21}'
    second = client(daemon).responses.create(
        model=daemon.model,
        input=[
            {"role": "user", "content": QUESTION},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": result},
        ],
        tools=[WEATHER],
        max_output_tokens=10,
        temperature=0,
    )
    tool_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": call.arguments},
    }
    messages: Any = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ]
    chat_tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER["description"],
                "parameters": WEATHER["parameters"],
            },
        }
    ]
    assert second.output_text == chat_text(daemon, messages, 10, tools=chat_tools)
    assert first.usage and second.usage and second.usage.input_tokens > first.usage.input_tokens


def test_custom_tool_is_a_function_of_one_string(daemon: Daemon) -> None:
    """A freeform tool (Codex's apply_patch) is offered as a function of one string; its call
    comes back as a custom_tool_call whose input is that string, streamed as its own events."""
    tools: Any = [{"type": "custom", "name": "apply_patch", "description": "Edit files"}]
    with client(daemon).responses.stream(
        model=daemon.model,
        input="Fix the bug",
        tools=tools,
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=300,
        temperature=0,
    ) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    item: Any = final.output[0]
    assert [o.type for o in final.output] == ["custom_tool_call"]
    assert item.name == "apply_patch" and isinstance(item.input, str) and item.call_id
    assert "response.custom_tool_call_input.delta" in types
    assert "response.custom_tool_call_input.done" in types
    back = client(daemon).responses.create(
        model=daemon.model,
        input=[
            {"role": "user", "content": "Fix the bug"},
            item.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "Done"},
        ],
        tools=tools,
        max_output_tokens=4,
    )
    assert back.output_text


def test_text_format_json_schema(daemon: Daemon) -> None:
    resp = client(daemon).responses.create(
        model=daemon.model, input="a person", text=JSON_FORMAT, max_output_tokens=100
    )
    assert resp.status == "completed", resp.output_text
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)


def test_stream_sends_the_typed_events_in_order(daemon: Daemon) -> None:
    with client(daemon).responses.stream(
        model=daemon.model,
        input="a person",
        text=JSON_FORMAT,
        max_output_tokens=100,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    head = ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[:4] == [*head, "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-4:] == [*tail, "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"} and deltas
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    text = "".join(e.delta for e in deltas)
    assert text == final.output_text and final.status == "completed"
    jsonschema.validate(json.loads(text), SCHEMA)
    assert final.usage and final.usage.output_tokens > 0
    assert final.id == events[0].response.id  # type: ignore[union-attr]


def test_stream_cut_by_max_output_tokens_ends_incomplete(daemon: Daemon) -> None:
    with client(daemon).responses.create(
        model=daemon.model, input=QUESTION, max_output_tokens=3, stream=True
    ) as stream:
        events = list(stream)
    last: Any = events[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"


def test_previous_response_id_continues_from_the_prefix_cache(daemon: Daemon) -> None:
    c = client(daemon)
    first = c.responses.create(
        model=daemon.model,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=6,
        temperature=0,
    )
    second = c.responses.create(
        model=daemon.model,
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input="And the re module?",
        max_output_tokens=6,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert first.usage and second.usage
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the re module?"},
    ]
    assert second.output_text == chat_text(daemon, messages, 6)


def test_retrieve_input_items_and_delete(daemon: Daemon) -> None:
    c = client(daemon)
    resp = c.responses.create(
        model=daemon.model,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        max_output_tokens=4,
        metadata={"run": "e2e"},
    )
    got = c.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text
    assert got.metadata == {"run": "e2e"}
    items = c.responses.input_items.list(resp.id, order="asc")
    texts = [(i.role, i.content[0].text) for i in items.data]  # type: ignore[union-attr]
    assert texts == [("developer", "Be brief."), ("user", "hi")]
    assert all(i.id for i in items.data)
    newest = c.responses.input_items.list(resp.id, limit=1)  # newest first by default
    assert [i.id for i in newest.data] == [items.data[1].id] and newest.has_more
    c.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=daemon.model, input="more", previous_response_id=resp.id)


def test_store_false_keeps_nothing(daemon: Daemon) -> None:
    c = client(daemon)
    resp = c.responses.create(model=daemon.model, input="hi", max_output_tokens=2, store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(resp.id)


BAD: list[tuple[dict[str, Any], int, str | None]] = [
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, 400, "input[0].type"),
    (
        {"input": [{"type": "function_call_output", "call_id": "call_none", "output": "1"}]},
        400,
        "input[0].call_id",
    ),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
    ({"input": "hi", "frobnicate": 1}, 400, "frobnicate"),
    (
        {"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        400,
        "tool_choice.type",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0].image_url",
    ),
    (
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
        400,
        "text.format.schema",
    ),
    ({}, 400, "input"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_input_is_an_openai_error_and_the_daemon_keeps_serving(
    daemon: Daemon, body: dict[str, Any], status: int, param: str | None
) -> None:
    url = f"{daemon.base_url}/v1/responses"
    r = httpx.post(url, json={"model": daemon.model, **body}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
    ok = httpx.post(
        url, json={"model": daemon.model, "input": "hi", "max_output_tokens": 2}, timeout=30
    )
    assert ok.status_code == 200


# Through remote backends: a second mlxd (the shared daemon) behind an `openai`-kind and an
# `anthropic`-kind backend (tests/e2e/test_cross_surfaces.py has more).


@pytest.fixture(scope="module")
def front(tiny_model: Path, shared_daemon: Daemon) -> Iterator[Daemon]:
    upstream = f"{shared_daemon.base_url}/v1"
    d = start_daemon(
        tiny_model,
        "--max-context",
        "512",
        "--backend",
        f"up=openai:{upstream}",
        "--model",
        "remote=up:tiny",
        "--backend",
        f"ant=anthropic:{upstream}",
        "--model",
        "claude=ant:tiny",
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.mark.parametrize(("model", "backend"), [("remote", "up"), ("claude", "ant")])
def test_remote_backends_serve_responses_through_the_event_path(
    front: Daemon, daemon: Daemon, model: str, backend: str
) -> None:
    # the upstream serves the same weights: the same greedy text as the local model's
    c = client(front)
    local = client(daemon).responses.create(
        model="tiny", input=QUESTION, max_output_tokens=6, temperature=0
    )
    raw = c.responses.with_raw_response.create(
        model=model, input=QUESTION, max_output_tokens=6, temperature=0
    )
    remote = raw.parse()
    assert raw.headers["x-mlxd-backend"] == backend and remote.model == model
    assert remote.output_text == local.output_text
    with c.responses.stream(model=model, input="a person", max_output_tokens=4) as stream:
        types = [e.type for e in stream]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    # the front stored it (the upstream never saw a Responses request): continuation works
    more = c.responses.create(
        model=model, input="more", previous_response_id=remote.id, max_output_tokens=2
    )
    assert more.usage and remote.usage and more.usage.input_tokens > remote.usage.input_tokens
    assert httpx.get(f"{daemon.base_url}/v1/responses/{remote.id}").status_code == 404


def test_json_output_reaches_an_openai_backend_and_is_refused_by_an_anthropic_one(
    front: Daemon,
) -> None:
    answer = client(front).responses.create(
        model="remote", input="a person", text=JSON_FORMAT, max_output_tokens=100
    )
    jsonschema.validate(json.loads(answer.output_text), SCHEMA)
    with pytest.raises(openai.BadRequestError, match="anthropic|Anthropic"):
        client(front).responses.create(
            model="claude", input="a person", text=JSON_FORMAT, max_output_tokens=100
        )
