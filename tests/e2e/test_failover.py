"""Failover when a local model's worker dies (docs/BACKENDS.md): `mlxd bench run --scenario
failover` streams to ``tiny`` (fallback ``spare``) and kills its worker mid-run. No request that
had not started streaming is lost, the fallback serves while the worker restarts, and then
``tiny`` serves again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]
CONCURRENCY = 3


@pytest.fixture(scope="module")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    config = tmp_path_factory.mktemp("failover") / "mlxd.toml"
    config.write_text(
        f'[models.tiny]\npath = "{tiny_model}"\nfallbacks = ["spare"]\n\n'
        f'[models.spare]\npath = "{tiny_model}"\n'
    )
    d = start_daemon(tiny_model, "--config", str(config), "--max-context", "512", name="other")
    yield d
    stop_daemon(d)


def _answered_by(d: Daemon) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{d.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["model"])


def test_a_dead_worker_fails_over_with_nothing_lost_then_serves_again(
    daemon: Daemon, tmp_path: Path
) -> None:
    assert _answered_by(daemon) == "tiny"
    out = tmp_path / "failover.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd",
            "bench",
            "run",
            "--scenario",
            "failover",
            "--url",
            daemon.base_url,
            "--model",
            "tiny",
            "--kill-worker",
            "--kill-after",
            "2",
            "--duration",
            "5",
            "--concurrency",
            str(CONCURRENCY),
            "--max-tokens",
            "24",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert figures["lost"] == 0, figures
    assert figures["cut"] <= CONCURRENCY, figures  # only those streaming when it died
    assert figures["served_by"].get("spare", 0) > 0, figures
    assert figures["failover_s"] is not None and figures["failover_s"] < 3, figures
    deadline = time.monotonic() + 60  # restarted: the model serves its own requests again
    while _answered_by(daemon) != "tiny":
        assert time.monotonic() < deadline, "tiny never came back"
        time.sleep(0.5)
