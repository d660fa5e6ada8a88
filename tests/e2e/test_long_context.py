"""A 32k-token prompt end to end on a made model with a 32k context (issue 21 point 4): its
chunked prefill interleaves with a running stream, the pool grows for it within the budget, and
the prefix cache holds it for the next request. One to five minutes on two CPU cores (slow)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LONG = 32_000  # prompt tokens, of a 32,768-token context
BUDGET_GB = 0.05  # the tiny model's 512 bytes a token: a pool of 80k tokens and a view


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.maker import write_model
    from mlxd.models.presets import model_config

    config = model_config("qwen3", "tiny")
    config["max_position_embeddings"] = 32_768
    out = tmp_path_factory.mktemp("models") / "tiny-32k"
    return write_model(out, config, progress=lambda line: None)


@pytest.fixture(scope="module")
def long_daemon(long_model: Path) -> Iterator[Daemon]:
    d = start_daemon(
        long_model,
        "--kv-cache-gb",
        str(BUDGET_GB),
        "--kv-chunk-mb",
        "1",
        "--prefill-chunk",
        "512",
        "--kv-idle-s",
        "600",
        "--speculate",
        "off",
    )  # one token per step: the steps are counted
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def complete(d: Daemon, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    body = {"model": d.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=900)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def stream_times(
    d: Daemon, times: list[float], started: threading.Event, stop: threading.Event
) -> None:
    """A running stream, until ``stop``: the arrival time of each of its events."""
    body = {
        "model": d.model,
        "prompt": [5, 6, 7, 8],
        "max_tokens": 20_000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{d.base_url}/v1/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.monotonic())
                started.set()
            if stop.is_set():
                return


def test_a_32k_prompt_prefills_beside_a_running_stream_and_is_cached(long_daemon: Daemon) -> None:
    times: list[float] = []
    started, stop = threading.Event(), threading.Event()
    runner = threading.Thread(target=stream_times, args=(long_daemon, times, started, stop))
    runner.start()
    assert started.wait(60)
    prompt = [3 + (7 * j) % 250 for j in range(LONG)]
    t0 = time.monotonic()
    first = complete(long_daemon, prompt, 4)
    t1 = time.monotonic()
    stop.set()
    runner.join()
    assert first["usage"]["prompt_tokens"] == LONG
    during = [t for t in times if t0 <= t <= t1]
    gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
    # The stream kept decoding, a token per prefill chunk, and the chunks shrank as the prompt
    # went on (worker/sched/prefill_cost.py: 128 tokens deep in it, not 512): over 150 of them,
    # where chunks of 512 are 62.
    assert len(during) >= 150 and max(gaps) < (t1 - t0) / 10, (len(during), max(gaps), t1 - t0)
    m = long_daemon.admin_get(f"/admin/models/{long_daemon.model}/status").json()["memory"]
    assert LONG * 512 <= m["kv_reserved_bytes"] <= m["kv_budget_bytes"]
    again = complete(long_daemon, [*prompt[:-100], 9, 9, 9], 4)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= LONG - 100 - 32
