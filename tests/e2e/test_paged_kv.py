"""The paged KV cache through the whole daemon: cached_tokens over HTTP, the pool in the
worker's stats, a prompt beyond the pool refused with 400, a disconnect freeing blocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

SYSTEM = "You are a careful assistant. Answer briefly, in plain words, and cite nothing. " * 4


@pytest.fixture(scope="module")
def small_pool(tiny_model: Path) -> Iterator[Daemon]:
    # a pool of well under the model's 4096-token context: the context is capped to it
    d = start_daemon(tiny_model, "--kv-cache-gb", "0.0003", "--kv-block-size", "16")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def client(small_pool: Daemon) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=f"{small_pool.base_url}/v1", api_key="unused", max_retries=0)
    yield c
    c.close()


def stats(d: Daemon) -> dict[str, Any]:
    r = d.admin_get(f"/admin/models/{d.model}/stats")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def chat(client: openai.OpenAI, d: Daemon, messages: list[Any], **kw: Any) -> Any:
    return client.chat.completions.create(
        model=d.model, messages=messages, max_tokens=8, temperature=0, **kw
    )


def test_shared_system_prompt_and_next_turn_hit_the_prefix_cache(
    client: openai.OpenAI, small_pool: Daemon
) -> None:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi there."}]
    a = chat(client, small_pool, first)
    b = chat(client, small_pool, [first[0], {"role": "user", "content": "What is MLX?"}])
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens >= 32
    turn2 = first + [
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    c = chat(client, small_pool, turn2)
    assert c.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 16
    s = stats(small_pool)
    assert s["prefix_cache_hits"] >= 2 and s["prefix_cache_hit_tokens"] >= 64
    assert s["kv_block_size"] == 16 and s["kv_blocks_cached"] > 0
    assert s["kv_blocks_used"] + s["kv_blocks_free"] == s["kv_blocks_total"]


def test_metrics_show_the_workers_kv_blocks_prefix_cache_and_queue(
    client: openai.OpenAI, small_pool: Daemon
) -> None:
    """/metrics carries what the worker's stats say (polled every 2 s from its control socket)."""
    from prometheus_client.parser import text_string_to_metric_families

    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello."}]
    chat(client, small_pool, first)
    chat(client, small_pool, [first[0], {"role": "user", "content": "Why?"}])  # a hit
    s = stats(small_pool)
    labels = {"model": small_pool.model}
    deadline = time.monotonic() + 15
    while True:
        text = httpx.get(f"{small_pool.base_url}/metrics", timeout=10).text
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text)
            for x in f.samples
        }
        hits = samples.get(("mlxd_worker_prefix_cache_hits_total", tuple(labels.items())), 0)
        if hits >= s["prefix_cache_hits"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert hits >= s["prefix_cache_hits"] >= 1

    def kv(state: str) -> float:
        return samples[("mlxd_kv_blocks", (("model", small_pool.model), ("state", state)))]

    assert kv("total") == s["kv_blocks_total"] and kv("used") + kv("free") == kv("total")
    assert kv("cached") > 0
    key = tuple(labels.items())
    assert samples[("mlxd_queue_depth", key)] == 0 and samples[("mlxd_running_sequences", key)] == 0
    assert 0 < samples[("mlxd_prefix_cache_hit_rate", key)] <= 1
    assert ("mlxd_worker_preemptions_total", key) in samples
    gathered = samples[("mlxd_worker_decode_gathered_steps_total", key)]
    assert 0 <= gathered <= s["decode_gathered_steps"]  # a poll may predate the last steps
    step = samples[("mlxd_decode_step_seconds", (("model", small_pool.model), ("quantile", "0.5")))]
    assert step == pytest.approx(s["decode_step"]["p50_ms"] / 1000, rel=0.5) and step > 0


def test_a_prompt_beyond_the_pool_is_a_400(client: openai.OpenAI, small_pool: Daemon) -> None:
    s = stats(small_pool)
    pool_tokens = s["kv_blocks_total"] * s["kv_block_size"]
    assert pool_tokens < 4096  # the model's own context is larger: the pool is the limit
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(
            model=small_pool.model, prompt=[7] * (pool_tokens + 10), max_tokens=4
        )
    assert "context" in exc.value.message
    assert chat(client, small_pool, [{"role": "user", "content": "still fine?"}]).choices


def test_disconnect_frees_the_streams_blocks(small_pool: Daemon) -> None:
    body = {
        "model": small_pool.model,
        "prompt": SYSTEM,
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
    }
    url = f"{small_pool.base_url}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        during = stats(small_pool)
    assert during["kv_blocks_used"] > during["kv_blocks_cached"]  # the stream holds blocks
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = stats(small_pool)
        if s["kv_blocks_used"] == s["kv_blocks_cached"]:
            break
        time.sleep(0.1)
    assert s["kv_blocks_used"] == s["kv_blocks_cached"], s  # only the prefix cache holds any
    assert s["requests_cancelled"] >= 1


@pytest.mark.parametrize(
    ("arch", "extra", "served"),
    [
        (
            "llama",
            {"sliding_window": 8},
            "1 of 2 layers see a 8-token window: their K/V in slabs that go back behind it",
        ),
        ("mamba", {}, "contiguous (ArraysCache layer caches; snapshot prefix cache)"),
    ],
    ids=["sliding-window", "state-space"],
)
def test_models_beyond_plain_attention_say_how_they_are_served(
    tmp_path: Path, arch: str, extra: dict[str, Any], served: str
) -> None:
    """A sliding-window model is paged with its window layers in slabs (runners.window); a
    recurrent one is served on its own mlx-lm caches with the snapshot prefix cache; the
    worker's status says which."""
    from mlxd.models.maker import make_model

    model_dir = make_model(
        tmp_path / arch, arch=arch, size="tiny", progress=lambda line: None, **extra
    )
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        d = start_daemon(model_dir, "--max-context", "256", stderr=log)
        try:
            with openai.OpenAI(
                base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0
            ) as client:
                out = client.completions.create(
                    model=d.model,
                    prompt="one two three four five six seven eight nine ten",
                    max_tokens=24,
                    temperature=0,
                )
            assert out.usage.completion_tokens > 0
            r = d.admin_get(f"/admin/models/{d.model}/status")
            assert r.status_code == 200, r.text
            kv_cache = r.json()["kv_cache"]
            assert served in kv_cache, kv_cache
        finally:
            stop_daemon(d)
