"""The model pool end to end: a TOML config, on-demand loads, the memory budget, keep-alive.

Every model is the same tiny model under another name, so each worker reserves the same
footprint F; the budget holds two and a half of them. ``a`` is pinned, ``b`` preloaded, ``c``
(alias ``cee``) loads on its first request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from mlxd.config import ModelSpec, ServeConfig
from mlxd.daemon.footprint import footprint
from mlxd.worker.buffer_cache import limit_in_force
from tests.e2e.conftest import (
    Daemon,
    free_port,
    stop_daemon,
    visible_gpus,
    wait_healthy,
)

pytestmark = [pytest.mark.e2e]

CONTEXT = 512


def spawn(config: Path, *extra: str, env: dict[str, str] | None = None) -> Daemon:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--config",
        str(config),
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-context",
        str(CONTEXT),
        *extra,
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return wait_healthy(Daemon(proc, f"http://127.0.0.1:{port}", "a", config))


def size_of(model: Path) -> int:
    config = ServeConfig(models=(ModelSpec(name="x", path=str(model)),), max_context=CONTEXT)
    return footprint(config.models[0], config).total_bytes


@pytest.fixture(scope="module")
def pool(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    budget = size_of(tiny_model) * 5 // 2
    config = tmp_path_factory.mktemp("pool") / "mlxd.toml"
    config.write_text(f"""
max_memory = "{budget}B"
[models.a]
path = "{tiny_model}"
pinned = true
[models.b]
path = "{tiny_model}"
[models.c]
path = "{tiny_model}"
aliases = ["cee"]
preload = false
""")
    d = spawn(config, env={"CUDA_VISIBLE_DEVICES": "0"})  # one GPU: one budget for all
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def models(d: Daemon) -> dict[str, dict]:
    body = d.admin_get("/admin/status", timeout=10).json()
    return {m["name"]: m for m in body["models"]}


def chat(d: Daemon, model: str, max_tokens: int = 4) -> str:
    client = openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
    )
    return str(r.choices[0].finish_reason)


def test_models_lists_configured_models_with_their_state(pool: Daemon, tiny_model: Path) -> None:
    client = openai.OpenAI(base_url=f"{pool.base_url}/v1", api_key="unused")
    listed = {m.id: m.model_dump() for m in client.models.list()}
    assert set(listed) == {"a", "b", "c"}
    assert listed["a"]["loaded"] and listed["b"]["loaded"] and not listed["c"]["loaded"]
    assert listed["c"]["state"] == "unloaded" and listed["c"]["aliases"] == ["cee"]
    assert client.models.retrieve("cee").id == "cee"
    status = pool.admin_get("/admin/status", timeout=10).json()
    assert status["memory"]["reserved_bytes"] == 2 * size_of(tiny_model)
    assert models(pool)["a"]["memory_bytes"] == size_of(tiny_model)


def test_on_two_gpus_each_gpu_has_the_budget(tiny_model: Path, tmp_path: Path) -> None:
    """Two "GPUs" (the CPU ignores them), a budget of one model and a half. Slots take the
    GPUs in turn: x's two replicas 0 and 1, c 0, d 1. Both replicas load (one budget for all
    would hold one); c on GPU 0 unloads x's replica there only; d (a KV pool too large for
    any GPU) gets a 503 naming its GPU."""
    config = tmp_path / "mlxd.toml"
    config.write_text(f"""
max_memory = "{size_of(tiny_model) * 3 // 2}B"
[models.x]
path = "{tiny_model}"
replicas = 2
[models.c]
path = "{tiny_model}"
preload = false
[models.d]
path = "{tiny_model}"
preload = false
kv_cache_gb = 1
""")
    d = spawn(config, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    try:
        assert {name: m["gpus"] for name, m in models(d).items()} == {
            "x": "0,1",
            "c": "0",
            "d": "1",
        }
        rows = models(d)["x"]["replica_rows"]
        assert [(r["gpus"], r["state"]) for r in rows] == [("0", "ready"), ("1", "ready")]
        assert visible_gpus(rows[1]["pid"]) == "1"
        assert chat(d, "c") in ("length", "stop")  # room on GPU 0: x's replica there goes
        rows = models(d)["x"]["replica_rows"]
        assert [r["state"] for r in rows] == ["unloaded", "ready"]  # GPU 1's stays
        assert chat(d, "x") in ("length", "stop")  # served by the replica left
        client = openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="d", prompt="hi", max_tokens=2)
        assert err.value.status_code == 503 and "on GPU 1" in str(err.value.body)
    finally:
        assert stop_daemon(d) == 0


def test_under_the_budget_each_worker_caps_its_buffer_cache_to_its_headroom(pool: Daemon) -> None:
    """What MLX keeps of freed buffers counts against the reservation: the worker is told so."""
    from mlxd.daemon.footprint import RUNTIME_BYTES

    info = models(pool)["a"]
    headroom = info["memory_bytes"] - info["weights_bytes"] - info["kv_bytes"]
    status = pool.admin_get("/admin/models/a/status", timeout=10).json()
    limit = status["memory"]["cache_limit_bytes"]
    wanted = min(limit_in_force(), max(64 * 2**20, headroom - RUNTIME_BYTES))
    assert limit is not None and abs(limit - wanted) <= 1


def test_two_models_serve_concurrent_requests(pool: Daemon) -> None:
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda m: chat(pool, m, 16), ["a", "b", "a", "b"]))
    assert all(r in ("length", "stop") for r in results)


def test_a_third_model_evicts_the_lru_idle_one_and_a_busy_one_is_never_evicted(
    pool: Daemon,
) -> None:
    chat(pool, "a")  # a is now more recent than b, but pinned anyway
    assert chat(pool, "cee") in ("length", "stop")  # loads c: b (LRU, idle) makes room
    state = {n: m["state"] for n, m in models(pool).items()}
    assert state == {"a": "ready", "b": "unloaded", "c": "ready"}
    assert "make room for c" in models(pool)["b"]["last_error"]

    # c busy with a long stream, a pinned: b cannot fit, and the 503 names the budget.
    started = threading.Event()

    def long_stream() -> None:
        body = {"model": "c", "prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{pool.base_url}/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                started.set()

    with ThreadPoolExecutor(1) as ex:
        done = ex.submit(long_stream)
        assert started.wait(60)
        client = openai.OpenAI(base_url=f"{pool.base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="b", prompt="hi", max_tokens=2)
        assert err.value.status_code == 503
        error = err.value.body
        assert isinstance(error, dict) and error["code"] == "memory_budget_exceeded"
        assert "--max-memory budget" in error["message"] and "c" in error["message"]
        done.result(timeout=120)
    assert models(pool)["c"]["state"] == "ready"
    assert chat(pool, "b") in ("length", "stop")  # now c is idle: it goes, b comes back
    assert models(pool)["c"]["state"] == "unloaded" and models(pool)["a"]["state"] == "ready"


def test_idle_workers_unload_after_keep_alive_and_load_again(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "mlxd.toml"
    config.write_text(f'[models.a]\npath = "{tiny_model}"\nkeep_alive = "1s"\n')
    d = spawn(config)
    try:
        deadline = time.monotonic() + 60
        while models(d)["a"]["state"] != "unloaded":
            assert time.monotonic() < deadline, models(d)
            time.sleep(0.2)
        assert "keep-alive" in models(d)["a"]["last_error"]
        assert chat(d, "a") in ("length", "stop")  # loads it again; the client sees no error
    finally:
        assert stop_daemon(d) == 0
