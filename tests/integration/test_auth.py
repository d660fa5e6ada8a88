"""API keys on /v1/*: the right key (Bearer or x-api-key) works, anything else is a 401."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
from scripted_worker import DEFAULT_REPLY, MODEL

from mlxd.config import ApiKey

if TYPE_CHECKING:
    from conftest import Gateway

ALICE = ApiKey(name="alice", key="sk-alice-0123456789")
BOB = ApiKey(name="bob", key="sk-bob-9876543210", tier="low")
WRONG = "sk-wrong-5555555555"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def keyed(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(api_keys=(ALICE, BOB))


@pytest.fixture
def http(keyed: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed.url, timeout=10) as session:
        yield session


def client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["x-request-id"]


@pytest.mark.parametrize("key", [ALICE.key, BOB.key])
def test_right_key_works(keyed: Gateway, key: str) -> None:
    with client(keyed, key) as oai:
        reply = oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content == DEFAULT_REPLY


def test_wrong_key_raises_authentication_error(keyed: Gateway) -> None:
    with client(keyed, WRONG) as oai, pytest.raises(openai.AuthenticationError) as info:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    assert WRONG not in info.value.response.text


def test_wrong_key_on_models_raises_too(keyed: Gateway) -> None:
    with client(keyed, WRONG) as oai, pytest.raises(openai.AuthenticationError):
        oai.models.list()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Bearer {WRONG}"},
        {"Authorization": ALICE.key},
        {"Authorization": f"Basic {ALICE.key}"},
        {"x-api-key": WRONG},
    ],
)
def test_missing_or_malformed_key_is_401(http: httpx.Client, headers: dict[str, str]) -> None:
    response = http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert_401(response)
    for secret in (WRONG, ALICE.key):
        assert secret not in response.text


def test_x_api_key_header_works(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": ALICE.key})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY


@pytest.mark.parametrize("path", ["/v1/models", f"/v1/models/{MODEL}", "/v1/embeddings", "/v1"])
def test_every_v1_path_needs_a_key(http: httpx.Client, path: str) -> None:
    assert_401(http.get(path))
    assert http.get(path, headers={"Authorization": f"Bearer {ALICE.key}"}).status_code != 401


def test_health_and_metrics_stay_open(http: httpx.Client) -> None:
    assert http.get("/health").json()["status"] == "ok"
    assert http.get("/health/ready", params={"model": MODEL}).status_code == 200
    assert http.get("/metrics").status_code == 200


def test_no_keys_configured_means_no_auth(gateway: Gateway) -> None:
    with client(gateway, "anything") as oai:
        assert [m.id for m in oai.models.list()] == [MODEL]


def test_keys_never_reach_the_logs(http: httpx.Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {WRONG}"})
    http.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": ALICE.key})
    http.get("/health")  # the access line of the health check comes last
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert '"key":"alice"' in logged  # the access log names the key...
    assert WRONG not in logged and ALICE.key not in logged  # ...and never holds one
