"""A key's tier is its requests' priority; an explicit priority may lower it, never raise it."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from scripted_worker import MODEL, ScriptedWorker

from mlxd.config import ApiKey

if TYPE_CHECKING:
    from conftest import Gateway

KEYS = {
    tier: ApiKey(name=tier, key=f"sk-{tier}-key", tier=tier) for tier in ("high", "normal", "low")
}


@pytest.fixture(scope="module")
def tiered(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(api_keys=tuple(KEYS.values()))


@pytest.fixture
def http(tiered: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tiered.url, timeout=10) as session:
        yield session


def priority_sent(
    http: httpx.Client, worker: ScriptedWorker, tier: str | None, path: str = "chat", **extra: Any
) -> str:
    """POST one request with ``tier``'s key; return the priority of the Generate it caused."""
    request_id = f"tier-{secrets.token_hex(4)}"
    headers = {"X-Request-Id": request_id, **extra.pop("headers", {})}
    if tier is not None:
        headers["Authorization"] = f"Bearer {KEYS[tier].key}"
    if path == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
        response = http.post("/v1/chat/completions", json=body, headers=headers)
    else:
        body = {"model": MODEL, "prompt": "hi", **extra}
        response = http.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    generate = worker.wait_generate(f"{request_id}.")
    assert generate is not None
    return generate.priority


@pytest.mark.parametrize("tier", ["high", "normal", "low"])
def test_the_keys_tier_is_the_default_priority(
    http: httpx.Client, worker: ScriptedWorker, tier: str
) -> None:
    assert priority_sent(http, worker, tier) == tier
    assert priority_sent(http, worker, tier, path="completions") == tier


@pytest.mark.parametrize("tier, asked", [("low", "high"), ("low", "normal"), ("normal", "high")])
def test_an_explicit_priority_is_capped_to_the_tier(
    http: httpx.Client, worker: ScriptedWorker, tier: str, asked: str
) -> None:
    assert priority_sent(http, worker, tier, priority=asked) == tier
    assert priority_sent(http, worker, tier, headers={"X-Priority": asked}) == tier


@pytest.mark.parametrize("tier, asked", [("high", "low"), ("high", "normal"), ("normal", "low")])
def test_an_explicit_priority_may_lower_the_tier(
    http: httpx.Client, worker: ScriptedWorker, tier: str, asked: str
) -> None:
    assert priority_sent(http, worker, tier, priority=asked) == asked
    assert priority_sent(http, worker, tier, headers={"X-Priority": asked}) == asked


def test_a_bad_priority_is_still_a_400(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "priority": "vip"}
    headers = {"Authorization": f"Bearer {KEYS['low'].key}"}
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "priority"


def test_without_keys_any_explicit_priority_goes(gateway: Gateway, worker: ScriptedWorker) -> None:
    with httpx.Client(base_url=gateway.url, timeout=10) as open_http:
        assert priority_sent(open_http, worker, None, priority="high") == "high"
        assert priority_sent(open_http, worker, None) == "normal"
