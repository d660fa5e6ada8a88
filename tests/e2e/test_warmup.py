"""Warm-up at load (issue 41 point 4), through a real daemon: a model loading on demand shows
``warming`` (with the stage it builds) on /admin/overview, which `mlxd ps` and the status page
draw, then ``ready``; a request that arrives meanwhile waits and is answered; with
``--warmup-s 0`` (the CPU's default) there is no warming at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def _daemon(tiny_model: Path, tmp: Path, *extra: str) -> Daemon:
    config = tmp / "models.toml"
    config.write_text(f'[models.lazy]\npath = "{tiny_model}"\npreload = false\n')
    return start_daemon(tiny_model, "--config", str(config), "--max-context", "2048", *extra)


@pytest.fixture(scope="module")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = _daemon(tiny_model, tmp_path_factory.mktemp("warm"), "--warmup-s", "30")  # CPU: asked
    yield d
    stop_daemon(d)


@pytest.fixture(scope="module")
def cold(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = _daemon(tiny_model, tmp_path_factory.mktemp("cold"), "--warmup-s", "0")
    yield d
    stop_daemon(d)


def _lazy(daemon: Daemon) -> dict[str, Any]:
    models = daemon.admin_get("/admin/overview").json()["models"]
    return next(m for m in models if m["name"] == "lazy")


def _complete(daemon: Daemon, out: list[httpx.Response]) -> None:
    body = {"model": "lazy", "prompt": "hello world", "max_tokens": 4}
    out.append(httpx.post(f"{daemon.base_url}/v1/completions", json=body, timeout=120))


def _load_watching(daemon: Daemon) -> tuple[list[dict[str, Any]], list[httpx.Response]]:
    """Load ``lazy`` with a request; every overview row seen until it is ready, and the
    answers: that request's, and one more sent when it was first seen warming."""
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=_complete, args=(daemon, answers))]
    threads[0].start()
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not seen or seen[-1]["state"] != "ready"):
        seen.append(_lazy(daemon))
        if seen[-1]["state"] == "warming" and len(threads) == 1:
            threads.append(threading.Thread(target=_complete, args=(daemon, answers)))
            threads[-1].start()
        time.sleep(0.02)
    for t in threads:
        t.join(120)
    return seen, answers


def test_a_loading_worker_is_warming_then_ready_and_requests_meanwhile_wait(
    daemon: Daemon,
) -> None:
    from mlxd.cli import ps

    seen, answers = _load_watching(daemon)
    states = [m["state"] for m in seen]
    assert "warming" in states and states[-1] == "ready", states
    assert states.index("warming") < states.index("ready")
    warming = next(m for m in seen if m["state"] == "warming")
    assert "(" in warming["progress"] and "/" in warming["progress"]  # "decode at 4 rows (3/8)"
    row = ps._row(warming)  # what `mlxd ps` prints for it
    assert row["state"] == "warming" and row["reason"] == warming["progress"]
    assert len(answers) == 2, "no request arrived while it was warming"
    for r in answers:
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    stats = daemon.admin_get("/admin/models/lazy/stats").json()
    assert stats["requests_admitted"] == 2  # the warm-up's own requests are not counted
    assert stats["prefix_cache_hits"] == 0 and stats["kv_blocks_cached"] <= 2


def test_warm_up_off_by_knob(cold: Daemon) -> None:
    seen, answers = _load_watching(cold)
    assert [m["state"] for m in seen if m["state"] == "warming"] == []
    assert answers and answers[0].status_code == 200
    status = cold.admin_get("/admin/models/lazy/status").json()
    assert status["scheduler"]["warmup_s"] == 0
