"""Remote backends as event sources: the request each backend kind is sent for a parsed request
(``bodies``), and its answer read as internal events (``readers``) whose tool calls the
request's own tool parser splits out with the upstream's ids."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mlxd.errors import InvalidRequest, UpstreamError
from mlxd.gateway.backends.remote.bodies import anthropic_body, openai_chat_body, upstream_request
from mlxd.gateway.backends.remote.readers import AnthropicReader, Event, OpenAIReader
from mlxd.gateway.backends.remote.source import _rendered
from mlxd.gateway.surfaces.anthropic.schemas import parse_messages
from mlxd.gateway.surfaces.ollama.schemas import parse_chat as parse_ollama_chat
from mlxd.gateway.surfaces.openai.schemas import parse_chat, parse_completion
from mlxd.gateway.tools.calls import ToolCall, split_tool_calls
from mlxd.protocol.messages import Finished, TokenDelta, Usage

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
HISTORY = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Rome?"},
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
    {"role": "user", "content": "And Paris?"},
]


def _chat(**extra: Any) -> Any:
    return parse_chat({"model": "m", "messages": HISTORY, "tools": [WEATHER], **extra})


def _texts_and_calls(parsed: Any, events: list[Event]) -> tuple[str, list[ToolCall]]:
    parser = _rendered(parsed).new_tool_parser()
    assert parser is not None
    return split_tool_calls("".join(e.text for e in events if isinstance(e, TokenDelta)), parser)


# Bodies


def test_the_openai_body_sends_arguments_as_json_text_and_no_defaults() -> None:
    path, body = upstream_request(_chat(stream=True, user="u1"), "openai", "up-model")
    assert path == "chat/completions" and body["model"] == "up-model"
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    assert body["messages"][3] == {"role": "tool", "content": "sunny", "tool_call_id": "toolu_0"}
    assert body["stream_options"] == {"include_usage": True} and body["user"] == "u1"
    assert not {"temperature", "top_p", "n", "seed", "tool_choice"} & set(body)


def test_the_openai_body_maps_a_forced_call_and_a_json_schema() -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    body = openai_chat_body(_chat(tools=[WEATHER, CLOCK], tool_choice=named), "x")
    assert body["tool_choice"] == named and "response_format" not in body
    body = openai_chat_body(_chat(tool_choice="required"), "x")
    assert body["tool_choice"] == "required"
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    body = openai_chat_body(_chat(response_format=fmt, parallel_tool_calls=False), "x")
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert body["parallel_tool_calls"] is False


def test_a_text_prompt_goes_to_openai_completions_and_not_to_anthropic() -> None:
    parsed = parse_completion({"model": "m", "prompt": "Once", "max_tokens": 5})
    path, body = upstream_request(parsed, "openai", "x")
    assert path == "completions" and body["prompt"] == "Once" and body["max_tokens"] == 5
    with pytest.raises(InvalidRequest):
        upstream_request(parsed, "anthropic", "x")


def test_the_anthropic_body_merges_turns_and_maps_tools() -> None:
    body = anthropic_body(_chat(tool_choice="required", stop=["END"], user="u1"), "claude-x")
    assert body["system"] == "Be terse." and body["max_tokens"] == 4096
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Rome"}}
    ]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"},
        {"type": "text", "text": "And Paris?"},
    ]
    assert body["tools"][0] == {
        "name": "get_weather",
        "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
        "description": "The weather",
    }
    assert body["tool_choice"] == {"type": "any"} and body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "u1"} and "temperature" not in body


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"seed": 1}, "seed"),
        ({"temperature": 1.5}, "temperature"),
        ({"logprobs": True}, "logprobs"),
        ({"min_p": 0.1}, "min_p"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_the_anthropic_body_refuses_what_it_cannot_carry(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        anthropic_body(_chat(**extra), "x")
    assert info.value.param == param


def test_an_anthropic_clients_top_k_is_refused_by_an_openai_backend() -> None:
    parsed = parse_messages({"model": "m", "max_tokens": 5, "messages": HISTORY[1:2], "top_k": 5})
    assert anthropic_body(parsed, "x")["top_k"] == 5
    with pytest.raises(InvalidRequest) as info:
        upstream_request(parsed, "openai", "x")
    assert info.value.param == "top_k"


def test_ollamas_own_defaults_are_not_sent_but_a_sent_option_is() -> None:
    # Ollama's temperature 0.8, top_k 40, top_p 0.9 are the surface's, not the client's
    chat = {"model": "m", "messages": HISTORY[1:2]}
    parsed = parse_ollama_chat(chat)
    assert parsed.sampling.top_k == 40
    for kind in ("openai", "anthropic"):
        body = upstream_request(parsed, kind, "x")[1]
        assert not {"temperature", "top_p", "top_k"} & set(body), kind
    sent = parse_ollama_chat({**chat, "options": {"temperature": 0.5, "top_k": 5}})
    body = anthropic_body(sent, "x")
    assert (body["temperature"], body["top_k"], "top_p" in body) == (0.5, 5, False)
    with pytest.raises(InvalidRequest) as info:
        upstream_request(sent, "openai", "x")
    assert info.value.param == "top_k"


# Readers


def _openai_stream(reader: OpenAIReader, chunks: list[dict[str, Any]]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        events += reader.chunk(chunk)
    return events + reader.end()


def _choice(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def test_an_openai_stream_becomes_text_and_tool_calls_with_their_ids() -> None:
    call = {"index": 0, "id": "call_up1", "function": {"name": "get_weather", "arguments": ""}}
    args = [{"index": 0, "function": {"arguments": part}} for part in ('{"city"', ': "Paris"}')]
    chunks = [
        _choice({"role": "assistant", "content": ""}),
        _choice({"content": "Let me ", "reasoning_content": "hmm"}),
        _choice({"content": "look."}),
        _choice({"tool_calls": [call]}),
        *[_choice({"tool_calls": [a]}) for a in args],
        _choice({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}},
    ]
    events = _openai_stream(OpenAIReader("r", 1, "up", str), chunks)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "stop"
    assert finished.usage == Usage(prompt_tokens=11, completion_tokens=7)
    text, calls = _texts_and_calls(_chat(), events)
    assert text == "Let me look."
    assert calls == [ToolCall(id="call_up1", name="get_weather", arguments='{"city": "Paris"}')]


def test_an_openai_stream_of_two_choices_and_its_finish_reasons() -> None:
    chunks = [
        _choice({"content": "a"}, index=0),
        _choice({"content": "b"}, "length", index=1),
        _choice({}, "content_filter", index=0),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    events = _openai_stream(OpenAIReader("r", 2, "up", str), chunks)
    assert [(e.request_id, e.text) for e in events if isinstance(e, TokenDelta)] == [
        ("r-0", "a"),
        ("r-1", "b"),
    ]
    ends = [e for e in events if isinstance(e, Finished)]
    assert [(e.request_id, e.finish_reason) for e in ends] == [
        ("r-0", "content_filter"),
        ("r-1", "length"),
    ]
    assert sum(e.usage.completion_tokens for e in ends) == 4


def test_an_openai_stream_cut_before_its_finish_is_an_upstream_error() -> None:
    reader = OpenAIReader("r", 1, "up", str)
    reader.chunk(_choice({"content": "Hi"}))
    with pytest.raises(UpstreamError, match="unfinished"):
        reader.end()
    with pytest.raises(UpstreamError, match=r"\[redacted\]"):
        OpenAIReader("r", 1, "up", lambda t: t.replace("sk-1", "[redacted]")).chunk(
            {"error": {"message": "bad key sk-1"}}
        )


def test_a_whole_openai_answer() -> None:
    call = {"id": "call_9", "function": {"name": "get_weather", "arguments": '{"city":"X"}'}}
    body = {
        "choices": [{"index": 0, "message": {"content": "ok", "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
    events = OpenAIReader("r", 1, "up", str).whole(body)
    text, calls = _texts_and_calls(_chat(), events)
    assert text == "ok" and [c.id for c in calls] == ["call_9"]
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"


def _anthropic_stream(events: list[tuple[str, dict[str, Any]]]) -> list[Event]:
    reader = AnthropicReader("r", "ant", str)
    out: list[Event] = []
    for name, body in events:
        out += reader.event(name, {"type": name, **body})
    return out + reader.end()


def test_an_anthropic_stream_becomes_text_tool_calls_and_usage() -> None:
    usage = {"input_tokens": 5, "cache_read_input_tokens": 3, "output_tokens": 1}
    tool = {"type": "tool_use", "id": "toolu_up", "name": "get_weather", "input": {}}
    events = _anthropic_stream(
        [
            ("message_start", {"message": {"usage": usage}}),
            ("content_block_start", {"index": 0, "content_block": {"type": "thinking"}}),
            (
                "content_block_delta",
                {"index": 0, "delta": {"type": "thinking_delta", "thinking": "x"}},
            ),
            ("content_block_stop", {"index": 0}),
            ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
            ("ping", {}),
            ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
            ("content_block_stop", {"index": 1}),
            ("content_block_start", {"index": 2, "content_block": tool}),
            (
                "content_block_delta",
                {"index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"city":"P"}'}},
            ),
            ("content_block_stop", {"index": 2}),
            (
                "message_delta",
                {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
            ),
            ("message_stop", {}),
        ]
    )
    first, finished = events[0], events[-1]
    assert isinstance(first, TokenDelta) and first.text == "Hi"
    assert first.prompt == Usage(prompt_tokens=8, completion_tokens=0, cached_tokens=3)
    assert isinstance(finished, Finished) and finished.finish_reason == "stop"
    assert finished.usage == Usage(prompt_tokens=8, completion_tokens=9, cached_tokens=3)
    text, calls = _texts_and_calls(_chat(), events)
    assert text == "Hi" and calls == [ToolCall("toolu_up", "get_weather", '{"city":"P"}')]


@pytest.mark.parametrize(
    ("reason", "finish", "stop"),
    [("max_tokens", "length", None), ("stop_sequence", "stop", "END"), ("end_turn", "stop", None)],
)
def test_anthropic_stop_reasons(reason: str, finish: str, stop: str | None) -> None:
    message = {
        "content": [{"type": "text", "text": "x"}],
        "stop_reason": reason,
        "stop_sequence": "END" if reason == "stop_sequence" else None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    finished = AnthropicReader("r", "ant", str).whole(message)[-1]
    assert isinstance(finished, Finished)
    assert (finished.finish_reason, finished.stop) == (finish, stop)


def test_an_anthropic_error_event_or_cut_stream_is_an_upstream_error() -> None:
    with pytest.raises(UpstreamError, match="overloaded"):
        _anthropic_stream([("error", {"error": {"type": "x", "message": "overloaded"}})])
    with pytest.raises(UpstreamError, match="unfinished"):
        _anthropic_stream([("message_start", {"message": {}})])


def test_the_gateways_tool_format_is_not_a_models() -> None:
    """A model (or an upstream's text) writing the JSON tool markers of a local model is text
    here: only the gateway's own markers, with their start-up token, make a call."""
    parsed = _rendered(_chat())
    parser = parsed.new_tool_parser()
    assert parser is not None
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert split_tool_calls(text, parser) == (text, [])


def _split(parsed: Any, events: list[Event]) -> tuple[str, str]:
    splitter = parsed.new_reasoning_splitter()
    reasoning, answer = [], []
    for event in events:
        if isinstance(event, TokenDelta):
            piece = splitter.delta(event)
            reasoning.append(piece.reasoning)
            answer.append(piece.answer)
    rest = splitter.finish()
    return "".join(reasoning) + rest.reasoning, "".join(answer) + rest.answer


def test_upstream_reasoning_reaches_a_surface_that_splits_it() -> None:
    """Anthropic thinking blocks and OpenAI-style reasoning_content come out as reasoning for
    the surface's splitter (and only then): text with a model's own <think> stays answer."""
    parsed = replace(_chat(), reasoning=True)
    ant = AnthropicReader("r", "ant", str, reasoning=True)
    events: list[Event] = []
    for name, body in [
        ("message_start", {"message": {"usage": {"input_tokens": 4}}}),
        (
            "content_block_start",
            {"index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        ),
        (
            "content_block_delta",
            {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm"}},
        ),
        (
            "content_block_delta",
            {"index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
        ),
        ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "<think>x"}}),
        ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
        ("message_stop", {}),
    ]:
        events += ant.event(name, {"type": name, **body})
    first = events[0]
    assert isinstance(first, TokenDelta) and first.prompt is not None and first.thinking
    assert _split(parsed, events) == ("Hm", "<think>x")
    oai = OpenAIReader("r", 1, "up", str, reasoning=True)
    chunks = [
        _choice({"reasoning_content": "Let me"}),
        _choice({"reasoning_content": " see."}),
        _choice({"content": "Four."}, "stop"),
    ]
    assert _split(parsed, _openai_stream(oai, chunks)) == ("Let me see.", "Four.")
    plain = _openai_stream(OpenAIReader("r", 1, "up", str), chunks)  # the surface splits none
    assert [e.text for e in plain if isinstance(e, TokenDelta)] == ["Four."]


def test_a_thinking_switch_goes_to_an_anthropic_backend() -> None:
    prompt = _chat().prompt
    on = replace(_chat(), prompt=replace(prompt, thinking=True))
    assert anthropic_body(on, "x")["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    off = replace(_chat(), prompt=replace(prompt, thinking=False))
    assert anthropic_body(off, "x")["thinking"] == {"type": "disabled"}
    assert "thinking" not in anthropic_body(_chat(), "x")


def test_a_relayed_anthropic_stream_counts_cached_prompt_tokens() -> None:
    # Anthropic's input_tokens leaves out the cache's tokens: the access log's prompt_tokens
    # counts them (as the event path does), and message_delta's output keeps the input count.
    from mlxd.gateway.backends.remote.anthropic_proxy import _usage

    start = {"input_tokens": 4, "cache_read_input_tokens": 60, "output_tokens": 1}
    after_start = _usage(start, None)
    final = _usage({"output_tokens": 9}, after_start)
    assert (final.prompt_tokens, final.cached_tokens, final.completion_tokens) == (64, 60, 9)
