"""``mlxd.access``: one JSON line per request, with the key's name but never the key or prompt;
and an ``X-Request-Id`` on every response."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from scripted_worker import DEFAULT_REPLY, MODEL

from mlxd.config import ApiKey

if TYPE_CHECKING:
    from conftest import Gateway

KEY = ApiKey(name="carol", key="sk-carol-secret-42")
PROMPT = "PRIVATE-PROMPT-TEXT please"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def logged(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(api_keys=(KEY,))


@pytest.fixture
def http(logged: Gateway) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY.key}"}
    with httpx.Client(base_url=logged.url, timeout=10, headers=headers) as session:
        yield session


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="mlxd.access")
    return caplog


def lines_for(caplog: pytest.LogCaptureFixture, request_id: str) -> list[dict[str, Any]]:
    """The access lines of ``request_id``, waiting briefly: they are written after the response."""
    deadline = time.monotonic() + 5
    while True:
        found = [json.loads(r.getMessage()) for r in caplog.records if r.name == "mlxd.access"]
        found = [line for line in found if line["request_id"] == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def chat(http: httpx.Client, stream: bool = False, **headers: str) -> tuple[str, httpx.Response]:
    request_id = f"log-{secrets.token_hex(4)}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    response = http.post(CHAT, json=body, headers={"X-Request-Id": request_id, **headers})
    return request_id, response


def test_one_line_per_request_with_tokens_and_times(
    http: httpx.Client, access: pytest.LogCaptureFixture
) -> None:
    request_id, response = chat(http)
    assert response.status_code == 200
    [line] = lines_for(access, request_id)
    assert line["endpoint"] == CHAT and line["method"] == "POST" and line["status"] == 200
    assert (line["model"], line["key"], line["stream"]) == (MODEL, "carol", False)
    assert line["prompt_tokens"] == len(PROMPT.split())
    assert line["completion_tokens"] == len(DEFAULT_REPLY.split())
    assert line["cached_tokens"] == 0 and line["finish_reason"] == "stop"
    assert 0 < line["ttft_ms"] <= line["e2e_ms"]


def test_streams_get_one_line_too(http: httpx.Client, access: pytest.LogCaptureFixture) -> None:
    request_id, response = chat(http, stream=True)
    assert response.text.endswith("data: [DONE]\n\n")
    [line] = lines_for(access, request_id)
    assert line["stream"] is True and line["completion_tokens"] == len(DEFAULT_REPLY.split())


def test_no_key_and_no_prompt_in_the_log(
    http: httpx.Client, access: pytest.LogCaptureFixture
) -> None:
    request_id, _ = chat(http)
    bad_id, bad = chat(http, Authorization="Bearer sk-guess")
    assert bad.status_code == 401
    [line] = lines_for(access, bad_id)
    assert (line["status"], line["key"], line["model"]) == (401, None, None)
    assert lines_for(access, request_id)
    text = "\n".join(r.getMessage() for r in access.records)
    assert KEY.key not in text and "sk-guess" not in text and "PRIVATE-PROMPT" not in text


def test_log_prompts_adds_the_prompt(
    make_gateway: Callable[..., Gateway], access: pytest.LogCaptureFixture
) -> None:
    gateway = make_gateway(log_prompts=True)
    with httpx.Client(base_url=gateway.url, timeout=10) as session:
        request_id, response = chat(session)
    assert response.status_code == 200
    [line] = lines_for(access, request_id)
    assert line["prompt"] == [{"role": "user", "content": PROMPT}]


@pytest.mark.parametrize(
    "method, path, headers",
    [
        ("GET", "/health", {}),
        ("GET", "/metrics", {}),
        ("GET", "/nowhere", {}),
        ("GET", "/v1/models", {"Authorization": "Bearer nope"}),
        ("DELETE", CHAT, {}),
        ("POST", CHAT, {"Content-Type": "application/json"}),
    ],
)
def test_every_response_has_a_request_id(
    http: httpx.Client, method: str, path: str, headers: dict[str, str]
) -> None:
    made = http.request(method, path, headers=headers, content=b"{")
    assert len(made.headers["x-request-id"]) == 32
    given = http.request(method, path, headers={**headers, "X-Request-Id": "abc-1"}, content=b"{")
    assert given.headers.get_list("x-request-id") == ["abc-1"]


def test_a_stream_has_the_request_id(http: httpx.Client) -> None:
    request_id, response = chat(http, stream=True)
    assert response.headers.get_list("x-request-id") == [request_id]
