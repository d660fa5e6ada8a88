"""Worker faults during active streams: SIGKILL, SIGSTOP (a hang), a native abort and an engine
stuck in one step; and a long step (a first CUDA compile, say), which is no fault at all.

Two models run in one daemon; faults hit model ``a`` while ``b`` keeps serving. The streams on
``a`` must end with a clean error event within seconds, and ``a``'s worker must come back with
its restart counted in ``/admin/status`` and ``/metrics``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
import zmq

from mlxd.protocol import codec
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import Ack, DebugCrash, DebugSleep
from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

NUM_STREAMS = 3
ERROR_WITHIN_S = 15.0  # SIGSTOP: up to 2 s between pings + a 2 s heartbeat timeout, with slack
EXIT_SEEN_WITHIN_S = 2.0  # an exit (SIGKILL, abort) is seen by the 0.5 s process poll
STEP_TIMEOUT_S = 8.0  # stuck: 8 s + up to 2 s until the ping that sees it, with slack


@pytest.fixture(scope="module")
def pair(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(
        tiny_model,
        "--model",
        f"b={tiny_model}",
        "--heartbeat-timeout",
        "2",
        "--step-timeout",
        str(STEP_TIMEOUT_S),
        "--max-context",
        "4096",
        name="a",
        env={"MLXD_TEST_FAULTS": "1"},
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def stream(d: Daemon, model: str, max_tokens: int, started: threading.Semaphore) -> dict:
    """One streamed completion: its finish reason or its error code, and when it ended."""
    body = {
        "model": model,
        "prompt": "hello",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    out: dict = {"finish_reason": None, "error": None, "chunks": 0}
    with httpx.stream("POST", f"{d.base_url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                out["error"] = data["error"]["code"]
            elif data["choices"][0]["finish_reason"]:
                out["finish_reason"] = data["choices"][0]["finish_reason"]
            out["chunks"] += 1
            if out["chunks"] == 1:
                started.release()
    out["ended"] = time.monotonic()
    return out


def open_streams(d: Daemon, model: str, max_tokens: int, pool: ThreadPoolExecutor) -> list[Future]:
    started = threading.Semaphore(0)
    futures = [pool.submit(stream, d, model, max_tokens, started) for _ in range(NUM_STREAMS)]
    for _ in futures:
        assert started.acquire(timeout=60), "a stream did not start"
    return futures


def complete(d: Daemon, model: str) -> str:
    body = {"model": model, "prompt": "hi", "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["finish_reason"])


def model_info(d: Daemon, name: str) -> dict:
    models = d.admin_get("/admin/status", timeout=10).json()["models"]
    return next(m for m in models if m["name"] == name)


def wait_ready(d: Daemon, name: str, restarts: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = model_info(d, name)
        if info["state"] == "ready" and info["restarts"] >= restarts:
            return info
        time.sleep(0.2)
    raise AssertionError(f"{name} did not come back: {model_info(d, name)}")


def send_control(d: Daemon, msg: DebugCrash | DebugSleep, reply_within_s: float = 0) -> object:
    """Send ``msg`` to worker ``a``'s control socket; wait for its reply if asked to."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(control_endpoint(d.worker_endpoint("a")))
    try:
        sock.send_multipart(codec.encode(msg))
        if not reply_within_s:
            return None
        assert sock.poll(int(reply_within_s * 1000)), f"no reply to {msg}"
        return codec.decode(sock.recv_multipart())
    finally:
        sock.close()


def crash(d: Daemon) -> None:
    send_control(d, DebugCrash(request_id="boom"))


def stuck(d: Daemon) -> None:
    send_control(d, DebugSleep(request_id="stuck", seconds=120))


def sigkill(d: Daemon) -> None:
    os.kill(d.worker_pid("a"), signal.SIGKILL)


def sigstop(d: Daemon) -> None:
    os.kill(d.worker_pid("a"), signal.SIGSTOP)


@pytest.mark.parametrize("fault", [sigkill, sigstop, crash, stuck], ids=lambda f: f.__name__)
def test_fault_fails_streams_cleanly_and_the_worker_comes_back(
    pair: Daemon, fault: Callable[[Daemon], None]
) -> None:
    before = wait_ready(pair, "a", restarts=0)
    with ThreadPoolExecutor(NUM_STREAMS) as pool:
        futures = open_streams(pair, "a", 3000, pool)
        fault(pair)
        hit = time.monotonic()
        assert complete(pair, "b") == "length"  # the other model is untouched
        results = [f.result(timeout=60) for f in futures]
    within = EXIT_SEEN_WITHIN_S if fault in (sigkill, crash) else ERROR_WITHIN_S
    for r in results:
        assert r["error"] == "worker_unavailable" and r["finish_reason"] is None, r
        assert r["ended"] - hit < within, (r["ended"] - hit, r)
    after = wait_ready(pair, "a", restarts=before["restarts"] + 1)
    assert after["pid"] != before["pid"] and not Path(f"/proc/{before['pid']}").exists()
    metrics = httpx.get(f"{pair.base_url}/metrics", timeout=10).text
    assert f'mlxd_worker_restarts_total{{model="a"}} {after["restarts"]}.0' in metrics
    assert complete(pair, "a") == "length"


def test_a_step_longer_than_the_heartbeat_timeout_is_not_taken_for_a_hang(pair: Daemon) -> None:
    """The engine thread blocks for longer than two ping rounds (2 s apart, 2 s timeout): the
    control thread still answers, so the worker lives and its streams finish."""
    before = wait_ready(pair, "a", restarts=0)
    with ThreadPoolExecutor(NUM_STREAMS) as pool:
        futures = open_streams(pair, "a", 300, pool)
        reply = send_control(pair, DebugSleep(request_id="slow", seconds=5.5), reply_within_s=30)
        assert isinstance(reply, Ack), reply
        results = [f.result(timeout=60) for f in futures]
    assert all(r["finish_reason"] == "length" and r["error"] is None for r in results), results
    after = model_info(pair, "a")
    assert (after["pid"], after["restarts"], after["state"]) == (
        before["pid"],
        before["restarts"],
        "ready",
    ), after


def test_sigterm_drains_streams_in_flight_then_exits(tiny_model: Path) -> None:
    d = start_daemon(tiny_model, "--drain-timeout", "30", "--max-context", "1024")
    workers = d.children()
    with ThreadPoolExecutor(NUM_STREAMS) as pool:
        futures = open_streams(d, d.model, 200, pool)
        d.proc.send_signal(signal.SIGTERM)
        results = [f.result(timeout=60) for f in futures]
    assert all(r["finish_reason"] == "length" and r["error"] is None for r in results), results
    assert d.proc.wait(timeout=30) == 0
    assert not [p for p in workers if Path(f"/proc/{p}").exists()]


def test_requests_past_the_drain_timeout_end_with_an_error_of_their_own(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Requests still running when ``--drain-timeout`` passes after SIGTERM each end with a
    ``shutting_down`` error their client reads as its API's error (SSE streams: an error event
    and a complete body, not a connection closed mid-body; the official OpenAI, Anthropic and
    Ollama clients: a 503, an error event, an error line), and the daemon's log has no
    traceback for them."""
    log = tmp_path / "mlxd.log"
    with log.open("w") as stderr:
        d = start_daemon(
            tiny_model, "--drain-timeout", "1", "--max-context", "100000", stderr=stderr
        )
        with ThreadPoolExecutor(NUM_STREAMS + len(CLIENTS)) as pool:
            clients = [pool.submit(ask, d) for ask in CLIENTS.values()]
            futures = open_streams(d, d.model, 90_000, pool)
            wait_in_flight(d, NUM_STREAMS + len(CLIENTS))
            d.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            results = [f.result(timeout=60) for f in futures]
            errors = {name: f.result(timeout=60) for name, f in zip(CLIENTS, clients, strict=True)}
        assert d.proc.wait(timeout=30) == 0
    for r in results:
        assert r["error"] == "shutting_down" and r["finish_reason"] is None, r
        assert 1 <= r["ended"] - signalled < 1 + ERROR_WITHIN_S, r
    assert errors["openai"][:3] == ("InternalServerError", 503, "shutting_down"), errors
    assert errors["anthropic"][0] == "APIStatusError", errors  # the stream's error event
    assert errors["ollama"][0] == "ResponseError", errors
    assert all("the server is shutting down" in e[-1] for e in errors.values()), errors
    text = log.read_text()
    assert "Traceback" not in text and "timeout graceful shutdown exceeded" not in text, text


def wait_in_flight(d: Daemon, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while model_info(d, d.model)["in_flight"] < count:
        assert time.monotonic() < deadline, model_info(d, d.model)
        time.sleep(0.1)


def ask_openai(d: Daemon) -> tuple:
    with openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="x", max_retries=0) as client:
        try:
            client.completions.create(
                model=d.model, prompt="hi", max_tokens=90_000, extra_body={"ignore_eos": True}
            )
        except openai.APIStatusError as exc:
            return type(exc).__name__, exc.status_code, exc.code, str(exc)
    return ("finished",)


def ask_anthropic(d: Daemon) -> tuple:
    with anthropic.Anthropic(base_url=d.base_url, api_key="x", max_retries=0) as client:
        messages = [{"role": "user", "content": "hi"}]
        try:
            with client.messages.stream(model=d.model, max_tokens=90_000, messages=messages) as s:
                for _ in s:
                    pass
        except anthropic.APIStatusError as exc:
            return type(exc).__name__, str(exc)
    return ("finished",)


def ask_ollama(d: Daemon) -> tuple:
    client = ollama.Client(host=d.base_url)
    try:
        for _ in client.generate(
            model=d.model, prompt="hi", options={"num_predict": 90_000}, stream=True
        ):
            pass
    except ollama.ResponseError as exc:
        return type(exc).__name__, str(exc)
    finally:
        client._client.close()
    return ("finished",)


CLIENTS: dict[str, Callable[[Daemon], tuple]] = {
    "openai": ask_openai,
    "anthropic": ask_anthropic,
    "ollama": ask_ollama,
}
