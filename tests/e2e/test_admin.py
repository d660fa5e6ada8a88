"""Admin endpoints and `mlxd worker ...` / `mlxd ps` against a real `mlxd start` subprocess."""

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

from mlxd.daemon.footprint import UNCAPPED_CACHE_FLOOR
from mlxd.worker.buffer_cache import limit_in_force
from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

ADMIN_KEY = "s3cret-admin"


def mlxd(
    daemon: Daemon, *args: str, key: str | None = None, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI against ``daemon``; another ``home`` hides its admin socket (as from elsewhere)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLXD_URL", "MLXD_ADMIN_KEY")}
    env["MLXD_URL"] = daemon.base_url
    if key is not None:
        env["MLXD_ADMIN_KEY"] = key
    if home is not None:
        env["MLXD_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args], capture_output=True, text=True, timeout=60, env=env
    )


def complete(daemon: Daemon, max_tokens: int = 8) -> httpx.Response:
    body = {"model": daemon.model, "prompt": "hello world", "max_tokens": max_tokens}
    return httpx.post(f"{daemon.base_url}/v1/completions", json=body, timeout=30)


def supervisor_state(daemon: Daemon, key: str) -> str:
    r = httpx.get(f"{daemon.base_url}/admin/status", headers={"Authorization": f"Bearer {key}"})
    return str(r.json()["models"][0]["state"])


@pytest.fixture(scope="module")
def keyed(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(tiny_model, "--admin-key", ADMIN_KEY, "--max-context", "512")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_cli_status_and_stats_after_a_request(daemon: Daemon) -> None:
    assert complete(daemon, max_tokens=8).status_code == 200
    status = mlxd(daemon, "worker", "status", "tiny")
    assert status.returncode == 0, status.stderr
    assert "running" in status.stdout and str(daemon.model_path) in status.stdout
    stats = mlxd(daemon, "worker", "stats", "tiny", "--json")
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert data["requests_finished"] >= 1 and data["output_tokens"] >= 8
    assert data["ttft"]["num_samples"] >= 1


def test_http_admin_round_trip(daemon: Daemon) -> None:
    with daemon.admin() as admin:
        (model,) = admin.get("/admin/status").json()["models"]
        assert (model["name"], model["state"], model["restarts"]) == ("tiny", "ready", 0)
        assert model["pid"] in daemon.children()
        status = admin.get("/admin/models/tiny/status").json()
        assert status["pid"] == model["pid"] and status["max_context"] == 512
        assert status["memory"]["weights_bytes"] > 0
        # no --max-memory: MLX keeps freed buffers up to a floor, not the device's whole memory
        limit = min(limit_in_force(), UNCAPPED_CACHE_FLOOR)
        assert status["memory"]["cache_limit_bytes"] == limit
        r = admin.post("/admin/models/tiny/flush-cache")
        assert r.status_code == 200 and r.json()["state"] == "running"
        assert admin.get("/admin/models/nope/stats").status_code == 404


def test_cli_set_changes_settings_live(daemon: Daemon) -> None:
    r = mlxd(daemon, "worker", "set", "tiny", "max_num_seqs=8", "aging_s=5")
    assert r.returncode == 0 and "max_num_seqs=8" in r.stdout, r.stderr
    with daemon.admin() as admin:
        status = admin.get("/admin/models/tiny/status").json()
    assert status["scheduler"]["max_num_seqs"] == 8 and status["scheduler"]["aging_s"] == 5.0


@pytest.mark.parametrize("setting", ["max_num_seqs=0", "prefill_chunk=abc", "bogus=1"])
def test_cli_bad_set_value_is_a_one_line_error(daemon: Daemon, setting: str) -> None:
    r = mlxd(daemon, "worker", "set", "tiny", setting)
    assert r.returncode != 0 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and setting.split("=")[0] in r.stderr


def test_cli_drain_refuses_requests_until_resume(daemon: Daemon) -> None:
    r = mlxd(daemon, "worker", "drain", "tiny")
    assert r.returncode == 0 and "draining" in r.stdout, r.stderr
    refused = complete(daemon)
    assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
    assert mlxd(daemon, "worker", "resume", "tiny").returncode == 0
    assert complete(daemon).status_code == 200


def test_ps_lists_the_model(daemon: Daemon) -> None:
    r = mlxd(daemon, "ps")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.strip().splitlines()
    assert header.split()[:3] == ["MODEL", "STATE", "PID"]
    assert row.split()[:2] == ["tiny", "running"]


def test_tcp_admin_without_a_key_is_refused_even_from_loopback(daemon: Daemon) -> None:
    # A same-host proxy or tunnel makes every outside client loopback: TCP is no guard.
    for method, path in [
        ("GET", "/admin/status"),
        ("POST", "/admin/models/tiny/drain"),
        ("POST", "/admin/models/tiny/unload"),
    ]:
        r = httpx.request(method, f"{daemon.base_url}{path}")
        assert r.status_code == 403 and "Unix socket" in r.json()["error"]["message"], r.text
    assert complete(daemon).status_code == 200  # nothing was drained or unloaded


def test_the_admin_socket_is_private_to_the_daemons_user(daemon: Daemon) -> None:
    path = daemon.admin_socket()
    with daemon.admin() as admin:
        assert admin.get("/admin/status").status_code == 200
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_the_cli_elsewhere_needs_the_key_over_tcp(daemon: Daemon, tmp_path: Path) -> None:
    r = mlxd(daemon, "worker", "status", "tiny", home=tmp_path)
    assert r.returncode != 0 and "HTTP 403" in r.stderr and "--admin-key" in r.stderr


def test_admin_key_is_required_when_set(keyed: Daemon, tmp_path: Path) -> None:
    url = f"{keyed.base_url}/admin/models/tiny/stats"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    denied = mlxd(keyed, "worker", "status", "tiny", key="nope", home=tmp_path)
    assert denied.returncode != 0 and "HTTP 401" in denied.stderr
    assert mlxd(keyed, "worker", "status", "tiny", key=ADMIN_KEY, home=tmp_path).returncode == 0
    assert mlxd(keyed, "worker", "status", "tiny").returncode == 0  # this host: the socket


def test_shutdown_stops_the_worker_for_good(keyed: Daemon) -> None:
    r = mlxd(keyed, "worker", "shutdown", "tiny", key=ADMIN_KEY)
    assert r.returncode == 0 and "draining" in r.stdout, r.stderr
    deadline = time.monotonic() + 15
    while supervisor_state(keyed, ADMIN_KEY) != "stopped":
        assert time.monotonic() < deadline, "the worker did not stop"
        time.sleep(0.05)
    assert not keyed.children(), "the worker process should be gone, not restarted"
    ps = mlxd(keyed, "ps", key=ADMIN_KEY)
    assert ps.stdout.splitlines()[1].split()[:3] == ["tiny", "stopped", "-"]
    assert complete(keyed).status_code == 503
    assert stop_daemon(keyed) == 0
