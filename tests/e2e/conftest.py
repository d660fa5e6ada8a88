"""A real `mlxd start` subprocess on a tiny made model, shared by the e2e tests of a module."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp

from mlxd.config import WorkerConfig, data_dir
from mlxd.daemon import admin_socket


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    base_url: str
    model: str
    model_path: Path
    env: dict[str, str] | None = None

    def admin_socket(self) -> Path:
        path = admin_socket.find(data_dir({**os.environ, **(self.env or {})}), self.base_url)
        assert path is not None, "the daemon published no admin socket"
        return path

    def admin(self) -> httpx.Client:
        """A client of the daemon's admin Unix socket, as the mlxd CLI on this host uses it
        (over TCP, admin needs the admin key)."""
        transport = httpx.HTTPTransport(uds=str(self.admin_socket()))
        return httpx.Client(transport=transport, base_url="http://mlxd", timeout=30)

    def admin_get(self, path: str, timeout: float = 30) -> httpx.Response:
        """``GET path`` through the admin socket."""
        with self.admin() as client:
            return client.get(path, timeout=timeout)

    def children(self) -> list[int]:
        return child_pids(self.proc.pid)

    def worker_endpoint(self, name: str | None = None) -> str:
        return self._worker_config(name)[1].endpoint

    def worker_pid(self, name: str | None = None) -> int:
        return self._worker_config(name)[0]

    def worker_config(self, name: str | None = None) -> WorkerConfig:
        """The config a spawned worker got (its group size, backend, KV budget)."""
        return self._worker_config(name)[1]

    def _worker_config(self, name: str | None) -> tuple[int, WorkerConfig]:
        """A spawned worker's pid and the config it got (`worker serve --config-json`)."""
        for pid in self.children():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "--config-json" in args:
                config = WorkerConfig.from_json(args[args.index("--config-json") + 1])
                if name is None or config.name == name:
                    return pid, config
        raise AssertionError(f"no worker process found for {name or 'any model'}")


def started_env(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in environ if b"=" in e)


def visible_gpus(pid: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` process ``pid`` was started with (its GPUs: mlxd.gpus)."""
    return started_env(pid).get("CUDA_VISIBLE_DEVICES")


def child_pids(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serve ``app`` (a small upstream a test scripts) with real uvicorn in a thread on a free
    loopback port; yields its ``http://127.0.0.1:PORT/v1`` base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def logged_lines(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines log's complete lines (the daemon may be writing the last one right now:
    a read can see it cut short)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def start_daemon(
    model_path: Path,
    *extra: str,
    name: str = "tiny",
    env: dict[str, str] | None = None,
    stderr: Any = None,
    wait: bool = True,
) -> Daemon:
    """``mlxd start`` with ``model_path`` as ``name``; returned once healthy unless not ``wait``."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--model",
        f"{name}={model_path}",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stderr=stderr
    )
    daemon = Daemon(proc, f"http://127.0.0.1:{port}", name, model_path, env)
    return wait_healthy(daemon) if wait else daemon


def wait_healthy(daemon: Daemon, timeout: float = 120) -> Daemon:
    """``daemon`` once its /health answers 200; fails when it exits or times out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"mlxd start exited with {daemon.proc.returncode}")
        try:
            if httpx.get(f"{daemon.base_url}/health", timeout=1).status_code == 200:
                return daemon
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    daemon.proc.kill()
    raise AssertionError("mlxd start did not become healthy")


def stop_daemon(daemon: Daemon, timeout: float = 30) -> int:
    daemon.proc.send_signal(signal.SIGTERM)
    return daemon.proc.wait(timeout=timeout)


@pytest.fixture(scope="module")
def daemon(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(tiny_model, "--max-context", "512")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="session")
def shared_daemon(tiny_model: Path) -> Iterator[Daemon]:
    """One daemon for the modules whose tests only send requests (never stop or break it)."""
    d = start_daemon(tiny_model, "--max-context", "512")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)
