"""Hostile HTTP input against the real gateway (uvicorn + ScriptedWorker): schemathesis fuzzing
from ``/openapi.json``, and hand-made nasties. Never a 500, every rejection OpenAI-shaped."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from scripted_worker import MODEL

if TYPE_CHECKING:
    from conftest import Gateway

CHAT = "/v1/chat/completions"


@pytest.fixture
def fuzzed(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(chat_timeout_s=10.0, completion_timeout_s=10.0)


def well_formed_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx is ``{"error": {"message": str, "type": str, ...}}`` JSON."""
    if response.status_code < 400:
        return None
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    return True


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzed_requests_never_get_a_server_error(fuzzed: Gateway, mode: GenerationMode) -> None:
    # schemathesis' pytest plugin does not run on pytest 9 yet: drive its strategies directly.
    api = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")
    fuzz = settings(
        max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )

    @fuzz
    @given(case=api.as_strategy(mode))
    def check(case: Any) -> None:
        case.call_and_validate(checks=[not_a_server_error, well_formed_error], timeout=30)

    check()


def test_openapi_document_lists_endpoints_and_models(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
    } <= set(doc["paths"])
    body = doc["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == [MODEL]


def assert_rejected(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]


@pytest.mark.parametrize("nesting", ["[" * 60_000, '{"a":' * 10_000 + "1" + "}" * 10_000])
def test_deeply_nested_json_is_a_400(http: httpx.Client, nesting: str) -> None:
    assert_rejected(http.post(CHAT, content=nesting.encode()), 400)


def test_deeply_nested_message_content_is_a_400(http: httpx.Client) -> None:
    deep = "[" * 1000 + "]" * 1000
    body = f'{{"model":"{MODEL}","messages":[{{"role":"user","content":{deep}}}]}}'
    assert_rejected(http.post(CHAT, content=body.encode()), 400)


@pytest.mark.parametrize("raw", [b'{"model": "\xff\xfe"}', b"\xc3\x28", b'{"a": "\xed\xa0\x80"}'])
def test_invalid_utf8_is_a_400(http: httpx.Client, raw: bytes) -> None:
    assert_rejected(http.post(CHAT, content=raw), 400)


@pytest.mark.parametrize("max_tokens", [10**30, 2**31, -1, 0, 1.5, "9"])
def test_absurd_max_tokens_is_a_400(http: httpx.Client, max_tokens: Any) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }
    assert_rejected(http.post(CHAT, json=body), 400)


def test_huge_number_is_a_400_not_a_hang(http: httpx.Client) -> None:
    body = f'{{"model":"{MODEL}","messages":[],"seed":{"9" * 50_000}}}'
    assert_rejected(http.post(CHAT, content=body.encode()), 400)
