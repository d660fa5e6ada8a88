"""Clients that vanish mid-prefill or mid-decode free their sequence, as the worker's own
status and stats show (through the admin endpoints, i.e. the control plane)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

LONG_PROMPT = [10 + i % 90 for i in range(6000)]  # ids: no tokenizing; 375 chunks of 16


@pytest.fixture(scope="module")
def chunky(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(tiny_model, "--prefill-chunk", "16", "--max-context", "8192")
    yield d
    stop_daemon(d)


def admin(d: Daemon, what: str) -> dict[str, Any]:
    r = d.admin_get(f"/admin/models/{d.model}/{what}", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def idle(d: Daemon) -> bool:
    s = admin(d, "status")
    return s["num_running"] + s["num_waiting"] + s["num_prefilling"] == 0


def stream(d: Daemon, prompt: Any, max_tokens: int) -> Any:
    body = {
        "model": d.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    return httpx.stream("POST", f"{d.base_url}/v1/completions", json=body, timeout=60)


def send_raw(d: Daemon, body: dict[str, Any]) -> socket.socket:
    """A request whose answer is never read (httpx would wait for the headers)."""
    host, port = d.base_url.removeprefix("http://").split(":")
    data = json.dumps(body)
    sock = socket.create_connection((host, int(port)))
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n{data}".encode())
    return sock


def test_disconnect_mid_prefill_frees_the_sequence_before_any_token(chunky: Daemon) -> None:
    before = admin(chunky, "stats")
    body = {"model": chunky.model, "prompt": LONG_PROMPT, "max_tokens": 50, "stream": True}
    sock = send_raw(chunky, body)
    wait_for(lambda: admin(chunky, "status")["num_prefilling"] == 1)
    sock.close()  # gone while the prompt is still being prefilled (no headers yet)
    wait_for(lambda: idle(chunky))
    after = admin(chunky, "stats")
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["output_tokens"] == before["output_tokens"]  # it never reached decode
    assert admin(chunky, "status")["memory"]["kv_bytes"] == 0  # its KV cache is gone too
    assert after["requests_finished"] == before["requests_finished"]


def test_disconnect_mid_decode_frees_the_sequence(chunky: Daemon) -> None:
    before = admin(chunky, "stats")
    with stream(chunky, "hello", 4000) as r:
        lines = (line for line in r.iter_lines() if line)
        for _ in range(5):
            assert next(lines).startswith("data: ")
        status = admin(chunky, "status")
        assert status["num_running"] == 1 and status["memory"]["kv_bytes"] > 0
    wait_for(lambda: idle(chunky))
    assert admin(chunky, "status")["memory"]["kv_bytes"] == 0
    after = admin(chunky, "stats")
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["requests_finished"] == before["requests_finished"]
    assert 0 < after["output_tokens"] - before["output_tokens"] < 4000


def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(
    shared_daemon: Daemon,
) -> None:
    """A connection idle for 6 s (past httpx's 5 s pool expiry, the official clients') still
    answers its next request: the server must not close it first, or a client sending at that
    instant gets "Server disconnected without sending a response"."""
    host, port = shared_daemon.base_url.removeprefix("http://").split(":")
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for wait in (0, 6):
            time.sleep(wait)
            sock.sendall(request)
            answer = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 200"), f"closed after {wait} s idle: {answer!r}"


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response (headers and body may come in separate segments); what came
    before the server closed the connection, if it did."""
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (chunk := sock.recv(4096)):
        body += chunk
    return head + b"\r\n\r\n" + body
