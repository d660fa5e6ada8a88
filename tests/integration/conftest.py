"""Fixtures of the integration tier: a ScriptedWorker and the real gateway under real uvicorn."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from scripted_worker import MODEL, ScriptedWorker

from mlxd.config import ModelSpec, ServeConfig
from mlxd.gateway.app import build_app
from mlxd.gateway.backends.local.pool import StaticPool

MAX_BODY_BYTES = 64 * 1024


@dataclass
class Gateway:
    """A running gateway: its base URL and the uvicorn server behind it."""

    url: str
    config: ServeConfig
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_gateway(config: ServeConfig, endpoints: dict[str, str]) -> Gateway:
    """Serve ``build_app(config, StaticPool(endpoints))`` on a free 127.0.0.1 port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = build_app(config, StaticPool(endpoints))
    uv_config = uvicorn.Config(
        app, log_config=None, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the gateway did not start")
        time.sleep(0.005)
    return Gateway(url=f"http://127.0.0.1:{port}", config=config, server=server, thread=thread)


def serve_config(**overrides: Any) -> ServeConfig:
    return ServeConfig(
        models=(ModelSpec(name=MODEL, path="scripted"),),
        max_body_bytes=MAX_BODY_BYTES,
        **overrides,
    )


@pytest.fixture(scope="session")
def worker() -> Iterator[ScriptedWorker]:
    tmp = tempfile.mkdtemp(prefix="mlxd-it-")
    scripted = ScriptedWorker(f"ipc://{tmp}/worker.sock", model=MODEL)
    scripted.start()
    yield scripted
    scripted.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def gateway(worker: ScriptedWorker) -> Iterator[Gateway]:
    running = start_gateway(serve_config(), {MODEL: worker.endpoint})
    yield running
    running.stop()


@pytest.fixture
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as oai:
        yield oai


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=10) as session:
        yield session


@pytest.fixture(scope="session")
def short_gateway(worker: ScriptedWorker) -> Iterator[Gateway]:
    """A second gateway on the same worker whose requests time out after 0.3 s."""
    config = serve_config(chat_timeout_s=0.3, completion_timeout_s=0.3)
    running = start_gateway(config, {MODEL: worker.endpoint})
    yield running
    running.stop()


@pytest.fixture
def short_http(short_gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=short_gateway.url, timeout=10) as session:
        yield session


@pytest.fixture(scope="module")
def make_gateway(worker: ScriptedWorker) -> Iterator[Callable[..., Gateway]]:
    """Start gateways on the session's worker with ``serve_config(**overrides)``; stopped after
    the module (``import conftest`` is ambiguous across tiers, so this is a fixture)."""
    started: list[Gateway] = []

    def make(endpoint: str | None = None, **overrides: Any) -> Gateway:
        # ``endpoint``: serve another ScriptedWorker than the session's.
        endpoints = {MODEL: endpoint or worker.endpoint}
        started.append(start_gateway(serve_config(**overrides), endpoints))
        return started[-1]

    yield make
    for running in started:
        running.stop()
