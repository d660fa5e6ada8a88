"""The Responses surface's parser and store: items and tools as the chat request sees them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.responses.schemas import parse_responses
from mlxd.gateway.surfaces.responses.store import ResponseNotFound, ResponseStore
from mlxd.protocol.messages import ChatPrompt


def parse(body: dict[str, Any], store: ResponseStore | None = None) -> Any:
    return parse_responses({"model": "m", **body}, store or ResponseStore())


def messages(body: dict[str, Any], store: ResponseStore | None = None) -> list[dict[str, Any]]:
    prompt = parse(body, store).prompt
    assert isinstance(prompt, ChatPrompt)
    return prompt.messages


def test_instructions_and_leading_developer_messages_are_one_system_message() -> None:
    got = messages(
        {
            "instructions": "A",
            "input": [
                {"role": "developer", "content": "B"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "C"}],
                },
                {"role": "developer", "content": "D"},
            ],
        }
    )
    assert got == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "C"},
        {"role": "system", "content": "D"},
    ]


def test_calls_join_the_assistant_message_and_outputs_are_tool_messages() -> None:
    got = messages(
        {
            "input": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Let me look."},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
                {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "*** x"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {
                    "type": "custom_tool_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "ok"}],
                },
            ]
        }
    )
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "patch", "arguments": {"input": "*** x"}},
        },
    ]
    assert got == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]


def test_a_tool_output_without_its_call_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})
    assert caught.value.param == "input[0].call_id" and "nope" in caught.value.message


def test_tools_the_server_cannot_run_are_dropped_and_custom_tools_take_one_string() -> None:
    parsed = parse(
        {
            "input": "hi",
            "tools": [
                {"type": "web_search"},
                {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
                {"type": "namespace", "name": "mcp", "tools": []},
                {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                {"type": "web_search"},
            ],
        }
    )
    assert parsed.spec.dropped_tools == ("web_search", "namespace")
    assert parsed.spec.custom_tools == {"apply_patch"}
    tools = parsed.prompt.tools
    assert [t["function"]["name"] for t in tools] == ["f", "apply_patch"]
    assert tools[1]["function"]["parameters"]["properties"] == {"input": {"type": "string"}}
    assert parsed.parse_tools


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ({"type": "web_search_preview"}, "tool_choice.type"),
        ({"type": "allowed_tools"}, "tool_choice.type"),
    ],
)
def test_a_tool_choice_the_server_cannot_honour_is_a_400(choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse({"input": "hi", "tools": [{"type": "web_search_preview"}], "tool_choice": choice})
    assert caught.value.param == param


def test_only_dropped_tools_offer_nothing() -> None:
    parsed = parse({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "auto"})
    assert parsed.prompt.tools is None and not parsed.parse_tools


def test_a_forced_custom_tool_constrains_the_output_to_its_call() -> None:
    parsed = parse(
        {
            "input": "hi",
            "tools": [{"type": "custom", "name": "apply_patch"}],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
    )
    schema = json.loads(parsed.sampling.response_format.schema)
    assert schema["properties"]["name"] == {"const": "apply_patch"} and parsed.forced_tool_call


def test_fields_map_to_sampling() -> None:
    parsed = parse(
        {
            "input": "hi",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "text": {"format": {"type": "json_object"}, "verbosity": "low"},
            "reasoning": {"effort": "low", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k",
            "client_metadata": {"x": 1},
            "store": False,
        }
    )
    s = parsed.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed) == (7, 0.5, 0.9, 3)
    assert s.response_format is not None and s.response_format.schema is None
    assert parsed.spec.store is False and parsed.spec.echo["max_output_tokens"] == 7


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "conversation": {"id": "c"}}, "conversation"),
        ({"input": "hi", "unknown_field": 1}, "unknown_field"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"input": []}, "input"),
    ],
)
def test_bad_fields_name_themselves(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(body)
    assert caught.value.param == param


def test_a_continuation_starts_from_the_stored_conversation() -> None:
    store = ResponseStore()
    earlier = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    store.put({"id": "resp_1"}, [], earlier)
    got = messages({"input": "c", "instructions": "S", "previous_response_id": "resp_1"}, store)
    assert got == [{"role": "system", "content": "S"}, *earlier, {"role": "user", "content": "c"}]
    with pytest.raises(ResponseNotFound):
        parse({"input": "c", "previous_response_id": "resp_2"}, store)


def test_the_store_is_bounded_by_count_and_bytes() -> None:
    store = ResponseStore(max_responses=2, max_bytes=400)
    for i in range(3):
        store.put({"id": f"r{i}"}, [], [])
    assert len(store) == 2
    with pytest.raises(ResponseNotFound):
        store.get("r0")
    store.get("r1")  # now the most recently used: r2 goes first
    store.put({"id": "big", "pad": "x" * 300}, [], [])
    store.get("r1")
    with pytest.raises(ResponseNotFound):
        store.get("r2")
    store.put({"id": "big2", "pad": "x" * 360}, [], [])  # with r1 it exceeds the bytes
    assert len(store) == 1 and store.bytes <= 400
    store.get("big2")
    store.put({"id": "huge", "pad": "x" * 500}, [], [])  # larger than the whole store: not kept
    with pytest.raises(ResponseNotFound):
        store.get("huge")
    store.delete("big2")
    assert len(store) == 0 and store.bytes == 0


@pytest.mark.parametrize(
    ("reasoning", "thinking"),
    [
        (None, None),
        ({"summary": "auto"}, None),
        ({"effort": "none"}, False),
        ({"effort": "low"}, True),
    ],
)
def test_reasoning_effort_is_the_templates_thinking_switch(
    reasoning: Any, thinking: bool | None
) -> None:
    assert parse({"input": "hi", "reasoning": reasoning}).prompt.thinking is thinking
