"""n > 1 and tools on the real tiny model through the official openai client."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MESSAGES = [{"role": "user", "content": "Tell me about the python standard library"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_CALL_ID = 3  # the made tokenizer's "<tool_call>" (tests/conftest.py)


def _texts(daemon: Daemon, seed: int) -> list[str]:
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        n=3,
        seed=seed,
        max_tokens=8,
        temperature=1.0,  # type: ignore[arg-type]
    )
    assert resp.usage is not None and resp.usage.completion_tokens <= 24
    return [c.message.content or "" for c in resp.choices]


def test_n3_seeded_choices_differ_and_repeat_while_others_run(daemon: Daemon) -> None:
    with ThreadPoolExecutor(2) as pool:
        noise = pool.submit(
            client(daemon).completions.create,
            model=daemon.model,
            prompt="import os",
            max_tokens=24,
            temperature=1.0,
        )
        first = _texts(daemon, seed=1234)
        noise.result()
    again = _texts(daemon, seed=1234)
    assert len(first) == 3 and first == again
    assert len(set(first)) > 1


def test_n3_usage_counts_the_prompt_once(daemon: Daemon) -> None:
    args = dict(
        model=daemon.model,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    one = client(daemon).chat.completions.create(**args)  # type: ignore[call-overload]
    three = client(daemon).chat.completions.create(n=3, **args)  # type: ignore[call-overload]
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 12
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}


def test_tools_are_rendered_into_the_prompt(daemon: Daemon) -> None:
    c = client(daemon)
    plain = c.chat.completions.create(model=daemon.model, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    tooled = c.chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        max_tokens=1,  # type: ignore[arg-type]
        tools=TOOLS,
    )
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # type: ignore[union-attr]


def test_an_unfinished_tool_call_comes_back_as_content(daemon: Daemon) -> None:
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=2,  # type: ignore[arg-type]
        logit_bias={str(TOOL_CALL_ID): 100},
        temperature=0,
    )
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    assert (choice.message.content or "").startswith("<tool_call>")


CITY_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_tool_call_round_trips_on_a_random_model(daemon: Daemon) -> None:
    c = client(daemon)
    first = c.chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        tools=CITY_TOOL,
        tool_choice=NAMED,  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
    )
    (call,) = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    history = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = c.chat.completions.create(
        model=daemon.model,
        messages=history,
        tools=CITY_TOOL,  # type: ignore[arg-type]
        max_tokens=2,
    )
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_required_tool_call_streamed_on_a_random_model(daemon: Daemon) -> None:
    stream = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        tools=CITY_TOOL,
        tool_choice="required",  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    calls = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
    assert [t.function.name for t in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert set(json.loads(calls[0].function.arguments)) == {"city"}  # type: ignore[union-attr, arg-type]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
