"""A client that stops reading its stream: bounded buffering, a cut after the stall limit, its
request cancelled on the worker, and nobody else slowed down."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest
from scripted_worker import MODEL, ScriptedWorker

if TYPE_CHECKING:
    from conftest import Gateway

STALL_S = 5.0  # well past the bound's cancel, even on 2 busy cores (3 s was not, once)


def stalled_stream(gateway: Gateway) -> socket.socket:
    """Send a streaming request for a flood of text, then read (almost) nothing."""
    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
    sock.connect((host, int(port)))
    body = json.dumps({"model": MODEL, "prompt": "FLOOD", "stream": True, "max_tokens": 5000})
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: stalled\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


def read_to_eof(sock: socket.socket, timeout_s: float) -> bytes:
    """What arrives until the server closes the connection (fails after ``timeout_s``)."""
    sock.settimeout(timeout_s)
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def test_stalled_reader_is_cut_and_cancelled_without_slowing_others(
    make_gateway: Callable[..., Gateway], worker: ScriptedWorker, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_gateway(stream_stall_timeout_s=STALL_S)
    started = time.monotonic()
    sock = stalled_stream(gateway)
    try:
        # The worker is told to stop long before 5000 pieces (20 MB) are out: the gateway
        # buffers a bounded number of events for a client that does not read.
        assert worker.wait_cancel("stalled.", timeout_s=10), "the flood was never cancelled"
        assert time.monotonic() - started < STALL_S
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for _ in range(5):
                t0 = time.monotonic()
                r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
                assert r.status_code == 200 and time.monotonic() - t0 < 2.0
        # The stall limit passes (checked every STALL_S / 4), then the socket is closed.
        time.sleep(STALL_S * 1.25 + 1.0)
        received = read_to_eof(sock, timeout_s=10)
        assert len(received) < 16 * 1024 * 1024  # far less than the 20 MB flood
        # Cut, not finished: no [DONE], no last chunk of the chunked body.
        assert b"[DONE]" not in received and not received.endswith(b"0\r\n\r\n")
        assert f"read nothing for {STALL_S:g}s; stream cut" in caplog.text
    finally:
        sock.close()
