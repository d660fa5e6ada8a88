"""The input boundary (gateway/surfaces/openai/schemas.py) on its own: every parameter's type and
range, unknown and unsupported fields, and what a valid body becomes. Each bad value is a 400
naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.openai import schemas
from mlxd.protocol.messages import ChatPrompt, JsonFormat, TextPrompt, TokenPrompt

HELLO = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": HELLO, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def refused(parse: Any, body: Any, param: str | None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    assert info.value.status_code == 400 and info.value.param == param, info.value.message
    return info.value


# Sampling parameters, shared by both endpoints: (field, accepted values, refused values).
RANGES: list[tuple[str, list[Any], list[Any]]] = [
    ("temperature", [0, 0.0, 1, 2.0], [-0.1, 2.01, "1", True, float("inf"), float("nan")]),
    ("top_p", [1e-9, 0.5, 1], [0, -0.1, 1.01, "0.5", False]),
    ("min_p", [0, 0.5, 1], [-0.01, 1.5, "x"]),
    ("top_k", [-1, 0, 40], [-2, 1.5, "5", True]),
    ("presence_penalty", [-2, 0, 2], [-2.1, 2.1, []]),
    ("frequency_penalty", [-2, 0, 2], [-2.1, 2.1, {}]),
    ("repetition_penalty", [0.5, 1, 10], [0, -1, "1"]),
    ("max_tokens", [1, 2**31 - 1], [0, -1, 2**31, 1.0, "8", True]),
    ("n", [1, schemas.MAX_N], [0, schemas.MAX_N + 1, 1.0]),
    ("seed", [0, -1, 2**63 - 1, -(2**63)], [2**63, -(2**63) - 1, 1.5, "1"]),
    ("min_tokens", [0, 4], [-1, "2"]),
    ("stream", [True, False], [1, "true"]),
    ("ignore_eos", [True, False], [0, "no"]),
    ("user", ["u"], [1, ["u"]]),
    ("priority", ["high", "normal", "low"], ["urgent", 1]),
    ("stop", ["s", ["a", "b"], ["x"] * schemas.MAX_STOP], ["", [""], [1], ["x"] * 17, 5]),
    ("stop_token_ids", [[], [0, 5]], [[-1], ["1"], [1.0], 5, [2**31]]),
    (
        "logit_bias",
        [{}, {"5": 100}, {"0": -100}],
        [{"5": 101}, {"x": 1}, {"-1": 1}, [1], {"5": "1"}],
    ),
]
CASES_OK = [(f, v) for f, ok, _ in RANGES for v in ok]
CASES_BAD = [(f, v) for f, _, bad in RANGES for v in bad]


@pytest.mark.parametrize("parse", [schemas.parse_chat, schemas.parse_completion])
@pytest.mark.parametrize(("field", "value"), CASES_OK)
def test_each_parameter_accepts_its_range(parse: Any, field: str, value: Any) -> None:
    body = chat(**{field: value}) if parse is schemas.parse_chat else completion(**{field: value})
    parse(body)


@pytest.mark.parametrize("parse", [schemas.parse_chat, schemas.parse_completion])
@pytest.mark.parametrize(("field", "value"), CASES_BAD)
def test_each_parameter_refuses_values_outside_it(parse: Any, field: str, value: Any) -> None:
    body = chat(**{field: value}) if parse is schemas.parse_chat else completion(**{field: value})
    refused(parse, body, field)


@pytest.mark.parametrize("field", [f for f, _, _ in RANGES])
def test_null_means_the_default(field: str) -> None:
    assert schemas.parse_chat(chat(**{field: None})) == schemas.parse_chat(chat())


def test_sampling_values_reach_the_protocol() -> None:
    parsed = schemas.parse_chat(
        chat(
            temperature=0.2,
            top_p=0.9,
            top_k=-1,
            max_tokens=7,
            seed=3,
            stop="END",
            logit_bias={"5": -1.5},
            n=2,
        )
    )
    s = parsed.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.seed) == (0.2, 0.9, 0, 7, 3)
    assert s.stop == ["END"] and s.logit_bias == {5: -1.5} and parsed.n == 2


@pytest.mark.parametrize("parse", [schemas.parse_chat, schemas.parse_completion])
@pytest.mark.parametrize("body", [None, [], "x", 1])
def test_the_body_must_be_an_object(parse: Any, body: Any) -> None:
    refused(parse, body, None)


@pytest.mark.parametrize("field", ["frobnicate", "Temperature", "max-tokens"])
def test_unknown_fields_are_refused_by_name(field: str) -> None:
    error = refused(schemas.parse_chat, chat(**{field: 1}), field)
    assert field in error.message
    refused(schemas.parse_completion, completion(**{field: 1}), field)


@pytest.mark.parametrize("field", ["functions", "audio", "store", "verbosity"])
def test_unsupported_fields_pass_only_when_null_or_false(field: str) -> None:
    schemas.parse_chat(chat(**{field: None}))
    schemas.parse_chat(chat(**{field: False}))
    refused(schemas.parse_chat, chat(**{field: "yes"}), field)


def test_fields_of_the_other_endpoint_are_unknown() -> None:
    refused(schemas.parse_completion, completion(messages=HELLO), "messages")
    refused(schemas.parse_chat, chat(prompt="hi"), "prompt")
    refused(schemas.parse_chat, chat(echo=False), "echo")


@pytest.mark.parametrize("model", [None, "", 5])
def test_model_is_a_required_string(model: Any) -> None:
    refused(schemas.parse_chat, chat(model=model), "model")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (None, "messages"),
        ([], "messages"),
        ("hi", "messages"),
        ([1], "messages[0]"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": "x", "extra": 1}], "messages[0].extra"),
        ([{"role": "user", "content": "x", "refusal": "no"}], "messages[0].refusal"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "messages[0].content[0].type"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            "messages[0].content[0].image_url",
        ),
        (
            [{"role": "assistant", "content": [{"type": "image_url"}]}],
            "messages[0].content[0].type",  # images come from the user only
        ),
        ([{"role": "user", "content": "x", "name": 3}], "messages[0].name"),
    ],
)
def test_bad_messages_name_the_field(messages: Any, param: str) -> None:
    refused(schemas.parse_chat, chat(messages=messages), param)


def test_text_parts_are_joined_and_null_echoes_pass() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = [{"role": "user", "content": parts, "refusal": None, "annotations": []}]
    prompt = schemas.parse_chat(chat(messages=msgs)).prompt
    assert isinstance(prompt, ChatPrompt) and prompt.messages[0]["content"] == "ab"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    parsed = schemas.parse_chat(chat(max_tokens=5, max_completion_tokens=9))
    assert parsed.sampling.max_tokens == 9
    refused(schemas.parse_chat, chat(max_completion_tokens=0), "max_completion_tokens")


def test_min_tokens_may_not_exceed_max_tokens() -> None:
    refused(schemas.parse_chat, chat(max_tokens=2, min_tokens=3), "min_tokens")


@pytest.mark.parametrize(
    ("options", "stream", "param"),
    [
        ({"include_usage": True}, False, "stream_options"),
        ([], True, "stream_options"),
        ({"other": 1}, True, "stream_options.other"),
        ({"include_usage": 1}, True, "stream_options.include_usage"),
    ],
)
def test_stream_options(options: Any, stream: bool, param: str) -> None:
    refused(schemas.parse_chat, chat(stream=stream, stream_options=options), param)
    ok = schemas.parse_chat(chat(stream=True, stream_options={"include_usage": True}))
    assert ok.include_usage


def test_priority_header_and_key_tier() -> None:
    assert schemas.parse_chat(chat(), header_priority="LOW ").priority == "low"
    assert schemas.parse_chat(chat(priority="normal"), header_priority="low").priority == "normal"
    assert schemas.parse_chat(chat(priority="high"), tier="normal").priority == "normal"
    assert schemas.parse_chat(chat(), tier="low").priority == "low"
    with pytest.raises(InvalidRequest) as info:
        schemas.parse_chat(chat(), header_priority="urgent")
    assert info.value.param == "X-Priority"


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (5, "response_format.type"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "text", "x": 1}, "response_format.x"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!"}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "schema": []}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "strict": "yes"}},
            "response_format.json_schema.strict",
        ),
    ],
)
def test_bad_response_formats(value: Any, param: str) -> None:
    refused(schemas.parse_chat, chat(response_format=value), param)


def test_response_formats_become_a_json_format() -> None:
    assert (
        schemas.parse_chat(chat(response_format={"type": "text"})).sampling.response_format is None
    )
    obj = schemas.parse_chat(chat(response_format={"type": "json_object"}))
    assert obj.sampling.response_format == JsonFormat()
    spec = {"name": "n", "schema": {"type": "object"}}
    parsed = schemas.parse_chat(chat(response_format={"type": "json_schema", "json_schema": spec}))
    assert parsed.sampling.response_format == JsonFormat(schema='{"type": "object"}')


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ],
)
def test_chat_logprobs(fields: dict[str, Any], param: str) -> None:
    refused(schemas.parse_chat, chat(**fields), param)
    ok = schemas.parse_chat(chat(logprobs=True, top_logprobs=3)).sampling
    assert ok.logprobs and ok.top_logprobs == 3


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hi", TextPrompt(text="hi")),
        (["hi"], TextPrompt(text="hi")),
        ([1, 2], TokenPrompt(token_ids=[1, 2])),
    ],
)
def test_completion_prompts(prompt: Any, expected: Any) -> None:
    assert schemas.parse_completion(completion(prompt=prompt)).prompt == expected


@pytest.mark.parametrize("prompt", [None, "", [], ["a", "b"], [[1], [2]], [-1], [1.5], 5])
def test_bad_completion_prompts(prompt: Any) -> None:
    refused(schemas.parse_completion, completion(prompt=prompt), "prompt")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"suffix": 1}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_completion_only_fields(fields: dict[str, Any], param: str) -> None:
    refused(schemas.parse_completion, completion(**fields), param)


def test_completion_defaults() -> None:
    parsed = schemas.parse_completion(completion(logprobs=2, best_of=1))
    assert parsed.sampling.max_tokens == schemas.COMPLETION_DEFAULT_MAX_TOKENS
    assert parsed.sampling.logprobs and parsed.sampling.top_logprobs == 2


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,", b"\xff", b"[" * 100_000])
def test_parse_json_refuses_malformed_bodies(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        schemas.parse_json(raw)
