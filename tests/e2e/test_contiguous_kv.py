"""The contiguous KV cache (``--no-paged-kv``) served end to end: answers, and a worker that
stays up while the gateway polls its status (its KV bytes counted from the batch cache)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

POLLS_S = 5.0  # the gateway polls each ready worker's status every 2 s


@pytest.fixture(scope="module")
def contiguous(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(tiny_model, "--no-paged-kv", "--max-context", "512")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_requests_and_status_polls_leave_the_worker_up(contiguous: Daemon) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    first = httpx.post(f"{contiguous.base_url}/v1/chat/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    time.sleep(POLLS_S)  # status polls while the batch cache holds K/V
    second = httpx.post(f"{contiguous.base_url}/v1/chat/completions", json=body, timeout=60)
    assert second.status_code == 200, second.text
    (model,) = contiguous.admin_get("/admin/status").json()["models"]
    assert model["state"] == "ready" and model["restarts"] == 0, model
    status = contiguous.admin_get("/admin/models/tiny/status").json()
    assert status["state"] == "running" and status["memory"]["kv_bytes"] >= 0, status
