"""No false health: a model that keeps crashing, refuses to load or fails every step is marked
failed with its reason; ``/health`` says degraded (200: the daemon still serves its other
models), that model's ``/health/ready`` answers 503, ``/v1/models`` and `mlxd ps` show it, and its
requests get a 503 naming the reason at once; `mlxd load` tries it again. A daemon whose every
model failed is down: ``/health`` answers 503.

One daemon serves four models built from the tiny one: ``ok`` (never broken), ``crashy``
(crashed on demand, ``--max-crashes 2``), ``failing`` (every forward raises, a test fault) and
``broken`` (an unknown architecture: its worker exits with code 3, loaded on its first request).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from mlxd.protocol import codec
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import Ack, DebugCrash, DebugFailSteps
from tests.e2e.conftest import Daemon, free_port, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

AT_ONCE_S = 1.0  # a failed model's 503 comes without waiting for a worker


@pytest.fixture(scope="module")
def broken_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with an architecture mlx-lm does not know: its worker exits with code 3."""
    broken = tmp_path_factory.mktemp("health") / "broken"
    shutil.copytree(tiny_model, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "no_such_arch"}))
    return broken


@pytest.fixture(scope="module")
def daemon(
    tiny_model: Path, broken_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    config = tmp_path_factory.mktemp("health") / "models.toml"
    config.write_text(
        f'[models.crashy]\npath = "{tiny_model}"\n'
        f'[models.failing]\npath = "{tiny_model}"\n'
        f'[models.broken]\npath = "{broken_model}"\npreload = false\n'
    )
    d = start_daemon(
        tiny_model,
        "--config",
        str(config),
        "--max-context",
        "512",
        "--max-crashes",
        "2",
        "--restart-backoff",
        "0.1",
        name="ok",
        env={"MLXD_TEST_FAULTS": "1"},
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def control(d: Daemon, name: str, msg: DebugCrash | DebugFailSteps) -> object:
    """Send ``msg`` to ``name``'s worker's control socket; its reply (None for a crash)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(control_endpoint(d.worker_endpoint(name)))
    try:
        sock.send_multipart(codec.encode(msg))
        if isinstance(msg, DebugCrash):
            return None
        assert sock.poll(30_000), f"no reply to {msg}"
        return codec.decode(sock.recv_multipart())
    finally:
        sock.close()


def model_info(d: Daemon, name: str) -> dict[str, Any]:
    models = d.admin_get("/admin/status", timeout=10).json()["models"]
    return next(m for m in models if m["name"] == name)  # type: ignore[no-any-return]


def wait_state(d: Daemon, name: str, state: str, restarts: int = 0, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = model_info(d, name)
        if info["state"] == state and info["restarts"] >= restarts:
            return info
        time.sleep(0.1)
    raise AssertionError(f"{name} is not {state}: {model_info(d, name)}")


def complete(d: Daemon, model: str, path: str = "/v1/completions") -> httpx.Response:
    body: dict[str, Any] = {"model": model, "max_tokens": 4}
    if path == "/v1/messages":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return httpx.post(f"{d.base_url}{path}", json=body, timeout=60)


def mlxd(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLXD_URL", "MLXD_ADMIN_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args, "--url", d.base_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def ps(d: Daemon) -> dict[str, str]:
    """`mlxd ps`: each model's line."""
    r = mlxd(d, "ps")
    assert r.returncode == 0, r.stderr
    return {line.split()[0]: line for line in r.stdout.splitlines()[1:]}


def assert_reported_failed(d: Daemon, name: str, reason: str) -> None:
    """``/health``, ``/v1/models``, `mlxd ps` and both APIs' requests all say ``name`` failed."""
    health = httpx.get(f"{d.base_url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
    failed = {f["model"]: f["reason"] for f in health.json()["failed"]}
    assert reason in failed[name] and "ok" not in failed, failed
    ready = httpx.get(f"{d.base_url}/health/ready", params={"model": name}, timeout=10)
    assert ready.status_code == 503 and reason in ready.json()["reason"], ready.text
    assert ready.json()["ready"] is False and ready.json()["state"] == "failed", ready.text
    ok = httpx.get(f"{d.base_url}/health/ready", params={"model": "ok"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["ready"] is True, ok.text
    assert httpx.get(f"{d.base_url}/health/ready", timeout=10).status_code == 503
    models = {m["id"]: m for m in httpx.get(f"{d.base_url}/v1/models", timeout=10).json()["data"]}
    assert models[name]["state"] == "failed" and reason in models[name]["reason"], models[name]
    assert models["ok"]["state"] == "ready" and models["ok"]["reason"] is None
    line = ps(d)[name]
    assert line.split()[1] == "failed" and reason in line, line
    status = mlxd(d, "status").stdout
    assert f"{name} failed: " in status and reason in status, status
    assert "health: degraded" in status and f"not ready: {name}" in status, status
    started = time.monotonic()
    openai, anthropic = complete(d, name), complete(d, name, "/v1/messages")
    assert time.monotonic() - started < 2 * AT_ONCE_S
    assert openai.status_code == 503 and reason in openai.json()["error"]["message"], openai.text
    assert anthropic.status_code == 503, anthropic.text
    assert anthropic.json()["type"] == "error" and reason in anthropic.json()["error"]["message"]
    assert complete(d, "ok").status_code == 200  # the others keep serving
    metrics = httpx.get(f"{d.base_url}/metrics", timeout=10).text
    assert f'mlxd_model_failed{{model="{name}"}} 1.0' in metrics
    assert 'mlxd_model_failed{model="ok"} 0.0' in metrics


def test_a_crash_looping_model_is_failed_until_mlxd_load(daemon: Daemon) -> None:
    wait_state(daemon, "crashy", "ready")
    control(daemon, "crashy", DebugCrash(request_id="1"))
    wait_state(daemon, "crashy", "ready", restarts=1)  # one crash: restarted (after 0.1 s)
    control(daemon, "crashy", DebugCrash(request_id="2"))
    info = wait_state(daemon, "crashy", "failed", timeout=10)
    assert info["restarts"] == 1 and info["pid"] is None, info
    assert_reported_failed(daemon, "crashy", "crashed 2 times within 60 s")

    load = mlxd(daemon, "load", "crashy")  # the operator tries it again
    assert load.returncode == 0 and load.stdout.startswith("crashy: ready"), load.stderr
    assert complete(daemon, "crashy").status_code == 200
    assert "crashy" not in str(httpx.get(f"{daemon.base_url}/health").json()["failed"])
    ready = httpx.get(f"{daemon.base_url}/health/ready", params={"model": "crashy"})
    assert ready.status_code == 200, ready.text


def test_a_model_refused_at_load_is_failed_with_its_reason(daemon: Daemon) -> None:
    r = complete(daemon, "broken")  # loads it: its worker exits with code 3 and says why
    assert r.status_code == 503 and "no_such_arch" in r.json()["error"]["message"], r.text
    info = model_info(daemon, "broken")
    assert info["state"] == "failed" and info["restarts"] == 0, info
    assert (
        info["last_error"].startswith("refused to load: ") and "no_such_arch" in info["last_error"]
    )
    assert_reported_failed(daemon, "broken", "no_such_arch")


def test_a_model_whose_every_step_fails_is_failed(daemon: Daemon) -> None:
    wait_state(daemon, "failing", "ready")
    reply = control(daemon, "failing", DebugFailSteps(request_id="f", message="device lost"))
    assert isinstance(reply, Ack), reply
    for _ in range(5):  # engine.MAX_FAILED_STEPS: one step each, none succeeds
        r = complete(daemon, "failing")
        assert r.status_code == 500 and "device lost" in r.text, r.text
    info = wait_state(daemon, "failing", "failed", timeout=10)  # seen by the next heartbeat
    assert "steps failed" in info["last_error"] and info["restarts"] == 0, info
    assert_reported_failed(daemon, "failing", "device lost")
    deadline = time.monotonic() + 15
    while model_info(daemon, "failing")["pid"] is not None:  # its worker is stopped
        assert time.monotonic() < deadline, model_info(daemon, "failing")
        time.sleep(0.1)


def test_detach_returns_for_a_daemon_whose_preloaded_model_failed(
    tiny_model: Path, broken_model: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    env["MLXD_HOME"] = str(tmp_path)
    start = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--detach",
        "--model",
        f"ok={tiny_model}",
        "--model",
        f"broken={broken_model}",
        "--port",
        str(free_port()),
    ]
    try:  # without the degraded answer counting as up, it waits for a 200 that never comes
        r = subprocess.run(start, capture_output=True, text=True, timeout=90, env=env)
        assert r.returncode == 0 and "mlxd is running at" in r.stdout, r.stderr
        assert "degraded" in r.stderr and "no_such_arch" in r.stderr, r.stderr
    finally:
        stop = subprocess.run(
            [sys.executable, "-m", "mlxd", "stop"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        if stop.returncode != 0 and (tmp_path / "mlxd.pid").exists():  # leave no daemon behind
            os.kill(int((tmp_path / "mlxd.pid").read_text().split()[0]), signal.SIGTERM)
    assert stop.returncode == 0, stop.stderr


def test_a_daemon_whose_every_model_failed_is_down(broken_model: Path) -> None:
    d = start_daemon(broken_model, "--max-context", "512", name="broken", wait=False)
    try:
        health = _health_once(d, lambda r: r.json()["status"] != "ok")
        assert health.status_code == 503 and health.json()["status"] == "down", health.text
        (failed,) = health.json()["failed"]
        assert failed["model"] == "broken" and "no_such_arch" in failed["reason"], failed
        ready = httpx.get(f"{d.base_url}/health/ready", params={"model": "broken"}, timeout=10)
        assert ready.status_code == 503, ready.text
        unknown = httpx.get(f"{d.base_url}/health/ready", params={"model": "nope"}, timeout=10)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"], unknown.text
    finally:
        stop_daemon(d)


def _health_once(d: Daemon, done: Callable[[httpx.Response], bool]) -> httpx.Response:
    """``/health`` once ``done`` holds for it (the daemon may still be starting)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert d.proc.poll() is None, "the daemon exited"
        try:
            r = httpx.get(f"{d.base_url}/health", timeout=2)
            if done(r):
                return r
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("/health never answered as expected")
