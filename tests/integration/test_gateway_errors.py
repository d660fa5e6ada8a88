"""Bad input and worker errors become OpenAI-shaped JSON errors with the right HTTP status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from scripted_worker import MODEL

from mlxd.gateway.surfaces.openai import schemas

if TYPE_CHECKING:
    from conftest import Gateway

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HELLO, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **fields}


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]


BAD_CHAT = [
    ({"model": MODEL}, "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=[{"content": "hi"}]), "messages[0].role"),
    (chat(messages=[{"role": "user", "content": 7}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": "hi", "extra": 1}]), "messages[0].extra"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        "messages[0].content[0].image_url",
    ),
    (
        chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
        "messages[0].content[0].type",
    ),
    ({"messages": HELLO}, "model"),
    (chat(model=3), "model"),
    (chat(temperature="hot"), "temperature"),
    (chat(temperature=2.5), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=-3), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(n=17), "n"),
    (chat(n=0), "n"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stop=["s"] * 17), "stop"),
    (chat(logit_bias={"abc": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (chat(priority="urgent"), "priority"),
    (chat(repetition_penalty=0), "repetition_penalty"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(response_format={"type": "xml"}), "response_format.type"),
    (chat(response_format="json"), "response_format.type"),
    (chat(response_format={"type": "json_object", "schema": {}}), "response_format.schema"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        "response_format.json_schema.name",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
        "response_format.json_schema.name",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": []}}),
        "response_format.json_schema.schema",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": 1}}),
        "response_format.json_schema.strict",
    ),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(parallel_tool_calls="yes"), "parallel_tool_calls"),
    (chat(tools=[{"type": "function"}]), "tools[0]"),
    (chat(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
        "tool_choice",
    ),
    (
        chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
        "tool_choice",
    ),
    (chat(tool_choice="required"), "tool_choice"),
    (
        chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
                }
            ]
        ),
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        chat(messages=[{"role": "assistant", "tool_calls": [{"type": "function"}]}]),
        "messages[0].tool_calls[0]",
    ),
    (chat(functions=[{"name": "f"}]), "functions"),
    (
        chat(messages=[{"role": "assistant", "content": "x", "refusal": "no"}]),
        "messages[0].refusal",
    ),
    (chat(service_tier="flex"), "service_tier"),
    (chat(user=3), "user"),
    (chat(stream=True, stream_options={"include_usage": True, "other": 1}), "stream_options.other"),
    (chat(frobnicate=1), "frobnicate"),
]

BAD_COMPLETION = [
    ({"model": MODEL}, "prompt"),
    (completion(prompt=""), "prompt"),
    (completion(prompt=[]), "prompt"),
    (completion(prompt=["a", "b"]), "prompt"),
    (completion(prompt=[1, -2]), "prompt"),
    (completion(echo=True), "echo"),
    (completion(suffix="end"), "suffix"),
    (completion(max_tokens=0), "max_tokens"),
    (completion(best_of=2), "best_of"),
    (completion(best_of=2, n=3), "best_of"),
    (completion(logprobs=True), "logprobs"),
    (completion(logprobs=21), "logprobs"),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
def test_bad_chat_body(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert_error(http.post(CHAT, json=body), 400, "invalid_request", param)


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETION)
def test_bad_completion_body(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert_error(http.post(COMPLETIONS, json=body), 400, "invalid_request", param)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe{"])
def test_malformed_json(http: httpx.Client, raw: bytes) -> None:
    headers = {"content-type": "application/json"}
    assert_error(http.post(CHAT, content=raw, headers=headers), 400, "invalid_request", None)


def test_unknown_model(http: httpx.Client) -> None:
    response = http.post(CHAT, json=chat(model="no-such-model"))
    assert_error(response, 404, "model_not_found", "model")
    assert "no-such-model" in response.json()["error"]["message"]


def test_unknown_model_retrieve(http: httpx.Client) -> None:
    assert_error(http.get("/v1/models/nope"), 404, "model_not_found", "model")


def test_unknown_route(http: httpx.Client) -> None:
    assert_error(http.post("/v1/engines/x"), 404, "not_found", None)


def test_wrong_method(http: httpx.Client) -> None:
    response = http.get(CHAT)
    assert_error(response, 405, "method_not_allowed", None)
    assert response.headers["allow"] == "POST"


def test_oversized_body(http: httpx.Client, gateway: Gateway) -> None:
    limit = gateway.config.max_body_bytes
    body = chat(messages=[{"role": "user", "content": "x" * (limit + 1)}])
    assert_error(http.post(CHAT, json=body), 413, "request_too_large", None)


def test_oversized_chunked_body(http: httpx.Client, gateway: Gateway) -> None:
    chunks = iter([b"{" + b" " * gateway.config.max_body_bytes, b"}"])  # no Content-Length: chunked
    assert_error(http.post(CHAT, content=chunks), 413, "request_too_large", None)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("overloaded", 429),
        ("invalid_request", 400),
        ("worker_unavailable", 503),
        ("timeout", 408),
        ("made_up_code", 500),
    ],
)
def test_worker_error_status(http: httpx.Client, code: str, status: int) -> None:
    response = http.post(CHAT, json=chat(messages=[{"role": "user", "content": f"ERROR:{code}"}]))
    expected = code if code != "made_up_code" else "internal_error"
    assert_error(response, status, expected, None)
    assert response.headers["x-request-id"]


@pytest.mark.parametrize("stream", [False, True])
def test_overloaded_has_retry_after(http: httpx.Client, stream: bool) -> None:
    body = chat(messages=[{"role": "user", "content": "ERROR:overloaded"}], stream=stream)
    response = http.post(CHAT, json=body)
    assert_error(response, 429, "overloaded", None)
    # The worker's estimate (ERROR:overloaded says 6.2 s), rounded up: not a constant 1 s.
    assert response.headers["retry-after"] == "7"


def test_error_mid_stream_is_an_event(http: httpx.Client) -> None:
    body = chat(messages=[{"role": "user", "content": "MIDERROR:internal_error"}], stream=True)
    response = http.post(CHAT, json=body)
    assert response.status_code == 200
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert '"error":{' in events[-2] and '"code":"internal_error"' in events[-2]
    assert '"content":"Hello "' in response.text


@pytest.mark.parametrize("field", sorted(schemas._UNSUPPORTED))
def test_unsupported_field_is_a_400_unless_off(http: httpx.Client, field: str) -> None:
    path = COMPLETIONS if field == "best_of" else CHAT
    body = completion(**{field: "on"}) if path == COMPLETIONS else chat(**{field: "on"})
    assert_error(http.post(path, json=body), 400, "invalid_request", field)
    off = chat(**{field: None}) if path == CHAT else completion(**{field: None})
    assert http.post(path, json=off).status_code == 200
