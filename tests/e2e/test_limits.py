"""Oversized input through the daemon is refused early, with a clear error and bounded memory."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon

pytestmark = [pytest.mark.e2e]

BODY_LIMIT = 8 * 1024 * 1024  # --max-body-bytes' default (tests/integration sets other limits)


@pytest.fixture
def limited(shared_daemon: Daemon) -> Daemon:
    return shared_daemon  # --max-context 512


def post(d: Daemon, prompt: str, max_tokens: int = 4) -> httpx.Response:
    body = {"model": d.model, "prompt": prompt, "max_tokens": max_tokens}
    return httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=60)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return dict(r.json()["error"])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_megabytes_of_prompt_are_refused_untokenized(limited: Daemon) -> None:
    started = time.monotonic()
    error = error_of(post(limited, "hello " * 500_000), 400)  # 3 MB, ~500k tokens
    assert error["param"] == "prompt" and "context is 512 tokens" in error["message"]
    assert time.monotonic() - started < 10  # tokenizing it all took ~3 s and 600 MB
    assert peak_rss_mb(limited.worker_pid()) < 400
    assert post(limited, "hello").status_code == 200


def test_body_over_the_configured_limit_is_a_413(limited: Daemon) -> None:
    error = error_of(post(limited, "x" * BODY_LIMIT), 413)
    assert error["code"] == "request_too_large" and str(BODY_LIMIT) in error["message"]


@pytest.mark.parametrize("max_tokens", [10**6, 2**31 - 1])
def test_max_tokens_beyond_the_context_is_a_400(limited: Daemon, max_tokens: int) -> None:
    error = error_of(post(limited, "hello", max_tokens), 400)
    assert error["param"] == "max_tokens"
