"""Continuous batching through the daemon: concurrency, backpressure, cancellation."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

LONG_TOKENS = 4000  # a stream that would run for seconds: most of the tiny model's 4096 context
PROMPTS = ["hello world", "The quick brown fox", "import os", "a b c d e f", "Python is", "zz"]


@pytest.fixture(scope="module")
def narrow(tiny_model: Path) -> Iterator[Daemon]:
    """One sequence at a time, two waiting: easy to fill."""
    d = start_daemon(tiny_model, "--max-num-seqs", "1", "--max-queued", "2")
    yield d
    stop_daemon(d)


def _client(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="x", max_retries=0, timeout=60)


def _complete(d: Daemon, prompt: str, max_tokens: int = 12) -> str:
    with _client(d) as c:
        r = c.completions.create(
            model=d.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return r.choices[0].text


def test_concurrent_requests_equal_one_at_a_time(daemon: Daemon) -> None:
    alone = [_complete(daemon, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _complete(daemon, p), PROMPTS))
    assert together == alone


def test_flood_gets_429_and_every_admitted_request_completes(narrow: Daemon) -> None:
    def attempt(i: int) -> int | str:
        try:
            return len(_complete(narrow, PROMPTS[i % len(PROMPTS)], max_tokens=40))
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["retry-after"]) >= 1
            return "429"

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(attempt, range(10)))
    refused = [r for r in results if r == "429"]
    assert refused and len(refused) <= 7, results
    assert all(isinstance(r, int) and r > 0 for r in results if r != "429")


def test_disconnecting_client_frees_its_slot(narrow: Daemon) -> None:
    stats = f"/admin/models/{narrow.model}/stats"
    before = narrow.admin_get(stats).json()
    body = {
        "model": narrow.model,
        "prompt": "hello",
        "max_tokens": LONG_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{narrow.base_url}/v1/completions", json=body, timeout=30) as r:
        chunks = r.iter_lines()
        assert next(chunks).startswith("data: ")
    # The only slot was taken by the stream above; it must be free again now.
    assert _complete(narrow, "import os", max_tokens=4)
    after = narrow.admin_get(stats).json()
    # Had the slot not been freed, the follow-up would just have queued behind the stream until
    # its LONG_TOKENS were out: so the stream must have been cancelled, far short of them.
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["output_tokens"] - before["output_tokens"] < LONG_TOKENS // 2
