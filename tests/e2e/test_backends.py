"""Remote backends (docs/BACKENDS.md): a front `mlxd start` routes models to a second real mlxd
daemon (the `openai` kind) and to a small misbehaving HTTP app in this process (500s that echo
the key, a stall, a stream cut mid-way, a closed port), through the official OpenAI client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.e2e.conftest import (
    Daemon,
    free_port,
    logged_lines,
    serving,
    start_daemon,
    stop_daemon,
)

SECRET = f"sk-mlxd-upstream-{secrets.token_hex(12)}"  # the backend's key: must leak nowhere
CLIENT_KEY = "client-key-1"  # the front daemon's own API key
KEY_ENV = "MLXD_TEST_UPSTREAM_KEY"
GREEDY = {"temperature": 0, "max_tokens": 8, "seed": 1}
MESSAGES = [{"role": "user", "content": "hello there"}]
BREAKER_COOLDOWN_S = 1.5


@dataclass
class Front:
    daemon: Daemon
    log: Path  # the daemon's stderr (debug level)
    request_log: Path
    upstream: Daemon

    openai_client: openai.OpenAI | None = None

    def client(self) -> openai.OpenAI:
        if self.openai_client is None:  # one, closed at teardown: sockets left open warn
            url = f"{self.daemon.base_url}/v1"
            self.openai_client = openai.OpenAI(
                base_url=url, api_key=CLIENT_KEY, max_retries=0, timeout=30
            )
        return self.openai_client

    def upstream_client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.upstream.base_url}/v1", api_key=SECRET, max_retries=0, timeout=30
        )

    def post(self, path: str, body: dict[str, object]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        return httpx.post(f"{self.daemon.base_url}{path}", json=body, headers=headers, timeout=30)


SEEN: Counter[str] = Counter()  # requests the flaky app received, by upstream model name
ORDER: list[str] = []  # the `user` of each request for the "slow" model, as they came


async def _flaky(request: Request) -> Response:
    # Each upstream model name is one way for a cloud API to fail.
    body = await request.json()
    model = body["model"]
    SEEN[model] += 1
    if model == "slow":  # answers after a while; records who came in which order
        ORDER.append(body.get("user", ""))
        await asyncio.sleep(1.5)
        message = {"role": "assistant", "content": "ok"}
        return JSONResponse(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )
    if model in ("fail500", "trip500"):  # some APIs echo (part of) the key they were sent
        echo = request.headers.get("authorization", "")
        return JSONResponse({"error": {"message": f"bad key {echo}", "type": "x"}}, 500)
    if model == "busy":  # a cloud API at its rate limit
        return JSONResponse(
            {"error": {"message": "slow down", "type": "rate_limit"}},
            429,
            headers={"Retry-After": "7"},
        )
    if model == "stall":
        await asyncio.sleep(10)
        return JSONResponse({})
    return StreamingResponse(_cut_stream(), media_type="text/event-stream")


async def _cut_stream() -> AsyncIterator[bytes]:
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "cut",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}
        ],
    }
    yield f"data: {json.dumps(chunk)}\n\n".encode()
    await asyncio.sleep(0.2)
    raise RuntimeError("connection cut mid-stream")  # uvicorn drops the connection


@pytest.fixture(scope="module")
def flaky_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/chat/completions", _flaky, methods=["POST"])])
    with serving(app) as url:
        yield url


def _config(tmp: Path, flaky_url: str) -> Path:
    remote = [
        ("m500", "flaky", "fail500", True),
        ("mstall", "flaky", "stall", True),
        ("mdead", "dead", "x", True),
        ("mcut", "flaky", "cut", True),
        ("only500", "flaky", "fail500", False),
        ("onlystall", "flaky", "stall", False),
        ("busyfallback", "flaky", "busy", True),
        ("busyonly", "flaky", "busy", True),
        ("tripped", "tripping", "trip500", False),
        ("queued", "single", "slow", False),
    ]
    lines = [
        f'[backends.flaky]\nkind = "openai"\nbase_url = "{flaky_url}"\n'
        f'api_key_env = "{KEY_ENV}"\ntimeout = "1s"\nbreaker_failures = 1000\n',
        f'[backends.single]\nkind = "openai"\nbase_url = "{flaky_url}"\nmax_concurrency = 1\n',
        f'[backends.tripping]\nkind = "openai"\nbase_url = "{flaky_url}"\n'
        f'breaker_failures = 2\nbreaker_cooldown = "{BREAKER_COOLDOWN_S}s"\n',
        f'[backends.dead]\nkind = "openai"\nbase_url = "http://127.0.0.1:{free_port()}/v1"\n',
    ]
    for name, backend, upstream, fallback in remote:
        lines.append(
            f'[models.{name}]\nbackend = "{backend}"\nupstream_model = "{upstream}"\n'
            + ('fallbacks = ["remote"]\n' if fallback else "")
            + ("fallback_on_busy = true\n" if name == "busyfallback" else "")
        )
    broken = tmp / "broken-model"  # a local model whose worker cannot load: 503 at first use
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    lines.append(f'[models.broken]\npath = "{broken}"\npreload = false\nfallbacks = ["remote"]\n')
    path = tmp / "backends.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def front(
    tiny_model: Path, flaky_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("backends")
    upstream = start_daemon(tiny_model, "--max-context", "512", "--api-key", SECRET)
    log, request_log = tmp / "front.log", tmp / "requests.log"
    with log.open("wb") as stderr:
        daemon = start_daemon(
            tiny_model,
            "--max-context",
            "512",
            "--api-key",
            CLIENT_KEY,
            "--log-level",
            "debug",
            "--backend",
            f"up=openai:{upstream.base_url}/v1",
            "--backend-key",
            f"up={KEY_ENV}",
            "--model",
            "remote=up:tiny",
            "--backend",
            f"ant=anthropic:{upstream.base_url}/v1",
            "--backend-key",
            f"ant={KEY_ENV}",
            "--model",
            "claude=ant:tiny",
            "--config",
            str(_config(tmp, flaky_url)),
            "--request-log",
            str(request_log),
            env={KEY_ENV: SECRET},
            stderr=stderr,
        )
    made = Front(daemon, log, request_log, upstream)
    yield made
    if made.openai_client is not None:
        made.openai_client.close()
    for d in (daemon, upstream):
        if d.proc.poll() is None:
            stop_daemon(d)


def _direct_chat(front: Front, **extra: object) -> str:
    with front.upstream_client() as up:
        answer = up.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY, **extra)  # type: ignore[call-overload]
    return str(answer.choices[0].message.content)


def test_chat_goes_to_the_remote_backend(front: Front) -> None:
    raw = front.client().chat.completions.with_raw_response.create(
        model="remote",
        messages=MESSAGES,
        **GREEDY,  # type: ignore[arg-type]
    )
    answer = raw.parse()
    assert raw.headers["x-mlxd-backend"] == "up"
    assert answer.model == "remote"
    assert answer.choices[0].message.content == _direct_chat(front)
    assert answer.usage is not None and answer.usage.completion_tokens == 8


def test_chat_stream_relays_every_chunk(front: Front) -> None:
    stream = front.client().chat.completions.create(
        model="remote",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _direct_chat(front)
    assert {c.model for c in chunks} == {"remote"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_completions_stream_and_not(front: Front) -> None:
    client = front.client()
    whole = client.completions.create(model="remote", prompt="hello", **GREEDY)  # type: ignore[arg-type]
    parts = client.completions.create(model="remote", prompt="hello", stream=True, **GREEDY)  # type: ignore[arg-type]
    with front.upstream_client() as up:
        direct = up.completions.create(model="tiny", prompt="hello", **GREEDY)  # type: ignore[arg-type]
    assert whole.model == "remote" and whole.choices[0].text == direct.choices[0].text
    assert "".join(p.choices[0].text for p in parts if p.choices) == direct.choices[0].text


def test_embeddings_of_a_remote_model(front: Front) -> None:
    answer = front.client().embeddings.create(model="remote", input=["hello", "there"])
    with front.upstream_client() as up:
        direct = up.embeddings.create(model="tiny", input=["hello", "there"])
    assert answer.model == "remote" and len(answer.data) == 2
    assert [d.embedding for d in answer.data] == [d.embedding for d in direct.data]
    r = front.post("/v1/embeddings", {"model": "claude", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert "no embeddings" in r.json()["error"]["message"]


def test_models_lists_remote_models(front: Front) -> None:
    rows = {m.id: m for m in front.client().models.list()}
    assert "tiny" in rows
    remote = rows["remote"].model_dump()
    assert remote["backend"] == "up" and remote["upstream_model"] == "tiny"
    assert remote["kind"] == "openai"


def test_the_daemons_own_key_is_required(front: Front) -> None:
    r = httpx.post(
        f"{front.daemon.base_url}/v1/chat/completions",
        json={"model": "remote", "messages": MESSAGES},
        timeout=30,
    )
    assert r.status_code == 401


def test_upstream_400_comes_back_as_400(front: Front) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        front.client().chat.completions.create(model="remote", messages=MESSAGES, temperature=7)
    assert info.value.body["param"] == "temperature"  # type: ignore[index]


@pytest.mark.parametrize("model", ["m500", "mstall", "mdead"])
def test_failover_before_the_first_byte(front: Front, model: str) -> None:
    raw = front.client().chat.completions.with_raw_response.create(
        model=model,
        messages=MESSAGES,
        **GREEDY,  # type: ignore[arg-type]
    )
    assert raw.parse().model == "remote" and raw.headers["x-mlxd-backend"] == "up"
    assert raw.parse().choices[0].message.content == _direct_chat(front)
    metrics = httpx.get(f"{front.daemon.base_url}/metrics").text
    assert f'mlxd_backend_failovers_total{{from_model="{model}",to_model="remote"}} 1.0' in metrics


def test_a_failed_local_model_fails_over_to_a_remote_one(front: Front) -> None:
    raw = front.client().chat.completions.with_raw_response.create(
        model="broken",
        messages=MESSAGES,
        **GREEDY,  # type: ignore[arg-type]
    )
    assert raw.parse().model == "remote" and raw.headers["x-mlxd-backend"] == "up"
    assert raw.parse().choices[0].message.content == _direct_chat(front)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_fail_over_from_a_failed_local_model(front: Front, stream: bool) -> None:
    """``/v1/messages`` on a local model that cannot load goes to its fallback (a remote model
    on an ``openai`` backend, translated), as ``/v1/chat/completions`` does."""
    model, text = _ask_claude(front.daemon.base_url, CLIENT_KEY, "broken", stream)
    assert model == "remote" and text == _ask_claude(front.upstream.base_url, SECRET, "tiny")[1]


def test_failover_of_a_stream_before_its_first_event(front: Front) -> None:
    chunks = list(
        front.client().chat.completions.create(
            model="mdead", messages=MESSAGES, stream=True, **GREEDY
        )
    )  # type: ignore[arg-type]
    assert {c.model for c in chunks} == {"remote"}


def test_5xx_without_fallback_is_502_naming_the_backend(front: Front) -> None:
    r = front.post("/v1/chat/completions", {"model": "only500", "messages": MESSAGES})
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "upstream_error" and "'flaky'" in error["message"]
    assert "answered HTTP 500" in error["message"] and "[redacted]" in error["message"]


def test_a_429_fails_over_only_with_fallback_on_busy(front: Front) -> None:
    """Both models fall back to ``remote``; only the one with ``fallback_on_busy`` moves there
    on the upstream's 429, the other answers it with the upstream's Retry-After."""
    r = front.post(
        "/v1/chat/completions", {"model": "busyfallback", "messages": MESSAGES, **GREEDY}
    )
    assert r.status_code == 200 and r.json()["model"] == "remote", r.text
    assert r.headers["x-mlxd-backend"] == "up"
    r = front.post("/v1/chat/completions", {"model": "busyonly", "messages": MESSAGES})
    assert r.status_code == 429 and r.headers["retry-after"] == "7", r.text


def test_the_breaker_stops_sending_to_a_failing_backend_then_probes_it(front: Front) -> None:
    """``tripping`` opens after 2 failures in a row: the third request fails at once without
    reaching the upstream (metrics say open), and after the cooldown one probe goes again."""

    def ask() -> httpx.Response:
        return front.post("/v1/chat/completions", {"model": "tripped", "messages": MESSAGES})

    def breaker_state() -> str:
        metrics = httpx.get(f"{front.daemon.base_url}/metrics").text
        pattern = r'^mlxd_backend_breaker_state\{backend="tripping"\} (\S+)$'
        return str(re.findall(pattern, metrics, re.M)[0])

    assert [ask().status_code for _ in range(2)] == [502, 502] and SEEN["trip500"] == 2
    assert breaker_state() == "2.0"
    r = ask()
    assert r.status_code == 502 and "circuit breaker" in r.json()["error"]["message"]
    assert SEEN["trip500"] == 2  # not sent
    time.sleep(BREAKER_COOLDOWN_S + 0.2)
    assert breaker_state() == "1.0"
    assert ask().status_code == 502 and SEEN["trip500"] == 3  # the probe went, and failed
    assert breaker_state() == "2.0" and "circuit breaker" in ask().json()["error"]["message"]


def test_a_backends_slots_go_high_priority_first(front: Front) -> None:
    """``single`` sends one request at a time: while ``first`` holds the slot, a ``low`` one
    and then a ``high`` one wait, and ``high`` goes next."""

    statuses = []

    def ask(user: str, priority: str) -> None:
        body = {"model": "queued", "messages": MESSAGES, "user": user, "priority": priority}
        statuses.append(front.post("/v1/chat/completions", body).status_code)

    threads = [
        threading.Thread(target=ask, args=a)
        for a in (("first", "normal"), ("low", "low"), ("high", "high"))
    ]
    for t in threads:
        t.start()
        time.sleep(0.4)  # each in line before the next (the first holds the slot 1.5 s)
    for t in threads:
        t.join(timeout=30)
    assert statuses == [200] * 3 and ORDER == ["first", "high", "low"], (statuses, ORDER)


def test_silence_past_the_timeout_is_504(front: Front) -> None:
    started = time.monotonic()
    r = front.post("/v1/chat/completions", {"model": "onlystall", "messages": MESSAGES})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert "'flaky'" in r.json()["error"]["message"] and time.monotonic() - started < 5


def test_no_failover_after_the_first_token(front: Front) -> None:
    body = {"model": "mcut", "messages": MESSAGES, "stream": True}
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    url = f"{front.daemon.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and r.headers["x-mlxd-backend"] == "flaky"
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hi"
    assert json.loads(events[0])["model"] == "mcut"
    assert json.loads(events[1])["error"]["code"] == "upstream_error"
    assert events[2:] == ["[DONE]"]


def test_a_client_leaving_cancels_the_upstream_request(front: Front) -> None:
    """The client of a remote model's stream goes away after the first event: the gateway
    closes the upstream stream, and the upstream mlxd cancels the request (far short of its
    tokens)."""
    stats = "/admin/models/tiny/stats"
    before = front.upstream.admin_get(stats).json()
    body = {
        "model": "remote",
        "messages": MESSAGES,
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    url = f"{front.daemon.base_url}/v1/chat/completions"
    with httpx.stream(
        "POST", url, json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=30
    ) as r:
        assert next(r.iter_lines()).startswith("data: ")
    deadline = time.monotonic() + 15
    while (after := front.upstream.admin_get(stats).json())["requests_cancelled"] == before[
        "requests_cancelled"
    ]:
        assert time.monotonic() < deadline, "the upstream request was never cancelled"
        time.sleep(0.2)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["output_tokens"] - before["output_tokens"] < 200


def test_metrics_and_access_log_name_the_backend(front: Front) -> None:
    front.client().chat.completions.create(model="remote", messages=MESSAGES, **GREEDY)  # type: ignore[arg-type]
    metrics = httpx.get(f"{front.daemon.base_url}/metrics").text
    assert 'mlxd_backend_requests_total{backend="up",model="remote",outcome="ok"}' in metrics
    assert (
        'mlxd_backend_requests_total{backend="flaky",model="only500",outcome="upstream_error"}'
        in metrics
    )
    assert 'model="remote",status="200"' in metrics  # the per-model request counter
    lines = logged_lines(front.request_log)
    assert any(x["model"] == "remote" and x.get("backend") == "up" for x in lines)


def _ask_claude(url: str, key: str, model: str, stream: bool = False) -> tuple[str, str]:
    with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
        args = {
            "model": model,
            "max_tokens": 8,
            "messages": MESSAGES,
            "extra_body": {"temperature": 0},
        }
        if not stream:
            answer = client.messages.create(**args)  # type: ignore[call-overload]
            return answer.model, "".join(b.text for b in answer.content if b.type == "text")
        with client.messages.stream(**args) as events:  # type: ignore[arg-type]
            text = "".join(events.text_stream)
            return events.get_final_message().model, text


@pytest.mark.parametrize("stream", [False, True])
def test_messages_go_to_an_anthropic_backend(front: Front, stream: bool) -> None:
    model, text = _ask_claude(front.daemon.base_url, CLIENT_KEY, "claude", stream)
    direct = _ask_claude(front.upstream.base_url, SECRET, "tiny")[1]
    assert model == "claude" and text == direct and text
    metrics = httpx.get(f"{front.daemon.base_url}/metrics").text
    assert 'mlxd_backend_requests_total{backend="ant",model="claude",outcome="ok"}' in metrics


def test_completions_to_an_anthropic_backend_are_refused_naming_the_model(front: Front) -> None:
    r = front.post("/v1/completions", {"model": "claude", "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "'claude'" in r.json()["error"]["message"]


def test_backend_health_shows_on_the_overview_and_in_ps(front: Front) -> None:
    """A backend whose last request failed is ``failing`` with that (redacted) error, one that
    answered is ``ok``: on ``/admin/overview`` (the status page draws it) and in ``mlxd ps``."""
    assert (
        front.post("/v1/chat/completions", {"model": "only500", "messages": MESSAGES}).status_code
        == 502
    )
    assert (
        front.post(
            "/v1/chat/completions", {"model": "remote", "messages": MESSAGES, **GREEDY}
        ).status_code
        == 200
    )
    base = front.daemon.base_url
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    listed = httpx.get(f"{base}/admin/overview", headers=auth).json()["backends"]
    flaky, up = (next(b for b in listed if b["name"] == n) for n in ("flaky", "up"))
    assert flaky["state"] == "failing" and flaky["failures"] >= 1
    assert "answered HTTP 500" in flaky["last_error"] and SECRET not in flaky["last_error"]
    assert up["state"] == "ok" and up["consecutive_failures"] == 0 and up["kind"] == "openai"
    ps = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MLXD_URL": base},
    )
    assert ps.returncode == 0, ps.stderr
    assert re.search(
        r"^flaky\s+openai\s+\S+\s+failing\s+\d+\s+\d+\s+.*HTTP 500", ps.stdout, re.M
    ), ps.stdout
    assert re.search(r"^up\s+openai\s+\S+\s+ok\s", ps.stdout, re.M), ps.stdout


def _flaky_health(front: Front) -> dict[str, object]:
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    listed = httpx.get(f"{front.daemon.base_url}/admin/overview", headers=auth).json()
    return dict(next(b for b in listed["backends"] if b["name"] == "flaky"))


def test_a_stream_cut_mid_way_counts_against_the_backend(front: Front) -> None:
    """The cut stream's headers came (200), so the request looked fine when sent: its broken
    body must still mark the backend failing."""
    body = {"model": "mcut", "messages": MESSAGES, "stream": True}
    url = f"{front.daemon.base_url}/v1/chat/completions"
    with httpx.stream(
        "POST", url, json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=30
    ) as r:
        list(r.iter_lines())
    health = _flaky_health(front)
    assert health["state"] == "failing" and "broke off" in str(health["last_error"]), health


def test_health_names_a_backend_that_keeps_failing(front: Front) -> None:
    for _ in range(3):
        r = front.post("/v1/chat/completions", {"model": "only500", "messages": MESSAGES})
        assert r.status_code == 502
    r = httpx.get(f"{front.daemon.base_url}/health")
    assert r.status_code == 200 and r.json()["status"] == "degraded", r.text
    (flaky,) = [f for f in r.json()["failed"] if f.get("backend") == "flaky"]
    ready = httpx.get(f"{front.daemon.base_url}/health/ready", params={"model": "only500"})
    assert ready.status_code == 503 and SECRET not in ready.text, ready.text
    assert "HTTP 500" in flaky["reason"] and SECRET not in r.text
    assert not any(f.get("backend") == "up" for f in r.json()["failed"])


def test_the_key_appears_in_no_output(front: Front) -> None:
    """Last in the file: every earlier request's logs are in place. The key must be in no log
    line, metric, error, listing or `mlxd ps --json`."""
    base = front.daemon.base_url
    env = {**os.environ, "MLXD_URL": base}
    ps = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert ps.returncode == 0, ps.stderr
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    outputs = {
        "ps": ps.stdout + ps.stderr,
        "metrics": httpx.get(f"{base}/metrics").text,
        "models": httpx.get(f"{base}/v1/models", headers=auth).text,
        "overview": httpx.get(f"{base}/admin/overview", headers=auth).text,
        "502": front.post("/v1/chat/completions", {"model": "only500", "messages": MESSAGES}).text,
        "log": front.log.read_text(errors="replace"),
        "request log": front.request_log.read_text(),
    }
    assert "backend 'flaky'" in outputs["log"] or "flaky" in outputs["502"]
    leaked = [name for name, text in outputs.items() if SECRET in text]
    assert leaked == []
