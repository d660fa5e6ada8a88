"""``GET /admin/overview`` (the JSON of the status page, `mlxd ps` and `mlxd status`) and the
page's own files at ``/`` and ``/static/*``, on the real gateway with a ScriptedWorker."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest
from scripted_worker import MODEL
from starlette.testclient import TestClient

from mlxd.config import ApiKey, ModelSpec, ServeConfig
from mlxd.gateway.app import build_app
from mlxd.gateway.backends.local.pool import StaticPool

if TYPE_CHECKING:
    from conftest import Gateway

KEY = ApiKey(name="dora", key="sk-dora-overview-secret")
ADMIN = "admin-overview-secret"
PROMPT = "PRIVATE-PROMPT-of-the-overview-test"
OVERVIEW = "/admin/overview"


@pytest.fixture(scope="module")
def keyed(make_gateway: Callable[..., Gateway]) -> Gateway:
    """API keys and an admin key, prompts logged: the overview must still never show one."""
    return make_gateway(api_keys=(KEY,), admin_key=ADMIN, log_prompts=True)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_loopback_reads_the_overview_without_a_key(http: httpx.Client) -> None:
    r = http.get(OVERVIEW)
    assert r.status_code == 200, r.text
    body = r.json()
    [model] = body["models"]
    assert (model["name"], model["state"], model["backend"], model["replicas"]) == (
        MODEL,
        "ready",
        "local",
        1,
    )
    assert body["backends"] == [] and isinstance(body["recent_requests"], list)
    assert {"pid", "version", "uptime_s", "memory"} <= body.keys()


def test_other_hosts_are_refused_when_no_key_is_set() -> None:
    config = ServeConfig(models=(ModelSpec(name="m", path="/m"),))
    client = TestClient(build_app(config, StaticPool({"m": "ipc:///tmp/mlxd-none.sock"})))
    r = client.get(OVERVIEW)  # TestClient's peer is "testclient": not loopback
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        (_bearer("wrong"), 401),
        (_bearer(KEY.key), 200),
        (_bearer(ADMIN), 200),
        ({"x-api-key": KEY.key}, 200),
    ],
)
def test_with_keys_an_api_key_or_the_admin_key_is_needed(
    keyed: Gateway, headers: dict[str, str], status: int
) -> None:
    assert httpx.get(f"{keyed.url}{OVERVIEW}", headers=headers).status_code == status


def test_recent_requests_show_the_key_name_never_the_prompt_or_key(keyed: Gateway) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
    done = httpx.post(f"{keyed.url}/v1/completions", json=body, headers=_bearer(KEY.key))
    assert done.status_code == 200, done.text
    r = httpx.get(f"{keyed.url}{OVERVIEW}", headers=_bearer(ADMIN))
    newest = r.json()["recent_requests"][0]
    assert newest["request_id"] == done.headers["x-request-id"]
    assert (newest["model"], newest["status"], newest["key"]) == (MODEL, 200, KEY.name)
    assert newest["completion_tokens"] > 0 and newest["e2e_ms"] > 0 and newest["time"] > 0
    assert PROMPT not in r.text and KEY.key not in r.text and ADMIN not in r.text
    assert all(row["endpoint"].startswith("/v1/") for row in r.json()["recent_requests"])


def test_the_page_and_its_files_are_served(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert (
        '<script src="/static/status.js"' in page.text
        and "default-src 'self'" in (page.headers["content-security-policy"])
    )
    script = http.get("/static/status.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "/admin/overview" in script.text
    assert http.get("/static/status.css").headers["content-type"].startswith("text/css")
    assert http.get("/static/nope.js").status_code == 404
