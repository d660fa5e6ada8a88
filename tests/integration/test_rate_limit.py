"""Per-key requests and tokens per minute: over the limit is a 429 with ``Retry-After``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
from scripted_worker import DEFAULT_REPLY, MODEL

from mlxd.config import ApiKey

if TYPE_CHECKING:
    from conftest import Gateway

RPM = ApiKey(name="rpm", key="sk-rpm-limited", rpm=2)
TPM = ApiKey(name="tpm", key="sk-tpm-limited", tpm=10)
STREAM_TPM = ApiKey(name="stream-tpm", key="sk-stream-tpm", tpm=10)
FREE = ApiKey(name="free", key="sk-unlimited")
HELLO = [{"role": "user", "content": "hi"}]
REPLY_TOKENS = len(DEFAULT_REPLY.split())  # the scripted worker counts words as tokens


@pytest.fixture(scope="module")
def limited(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(api_keys=(RPM, TPM, STREAM_TPM, FREE))


@pytest.fixture
def http(limited: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=limited.url, timeout=10) as session:
        yield session


def chat(http: httpx.Client, key: ApiKey, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "messages": HELLO, "stream": stream}
    return http.post("/v1/chat/completions", json=body, headers={"x-api-key": key.key})


def assert_429(response: httpx.Response, wait_s: float) -> None:
    """A rate-limit error whose ``Retry-After`` is ``wait_s`` rounded up (less what just passed)."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert wait_s <= int(response.headers["retry-after"]) <= wait_s + 1
    assert response.headers["x-request-id"]


def test_rpm_exceeded_is_429_with_retry_after(limited: Gateway, http: httpx.Client) -> None:
    with openai.OpenAI(base_url=f"{limited.url}/v1", api_key=RPM.key, max_retries=0) as oai:
        for _ in range(RPM.rpm or 0):
            oai.chat.completions.create(model=MODEL, messages=HELLO)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as info:
            oai.chat.completions.create(model=MODEL, messages=HELLO)  # type: ignore[arg-type]
    assert info.value.code == "rate_limit_exceeded"
    assert_429(chat(http, RPM), wait_s=60 / 2)  # one request flows back every 30 s


def test_tpm_exceeded_after_a_finished_request(http: httpx.Client) -> None:
    first = chat(http, TPM)
    assert first.status_code == 200
    used = first.json()["usage"]["total_tokens"]
    assert used == 1 + REPLY_TOKENS > TPM.tpm  # type: ignore[operator]
    debt = used - (TPM.tpm or 0)
    assert_429(chat(http, TPM), wait_s=debt * 60 / (TPM.tpm or 1))  # repaid at tpm / 60 per s


def test_streamed_tokens_count_too(http: httpx.Client) -> None:
    streamed = chat(http, STREAM_TPM, stream=True)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert chat(http, STREAM_TPM).status_code == 429


def test_limits_are_per_key(http: httpx.Client) -> None:
    for _ in range(5):
        assert chat(http, FREE).status_code == 200
