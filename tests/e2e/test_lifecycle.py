"""`mlxd start` process lifecycle: workers first, clean shutdown, no orphans, no socket files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mlxd.config import ModelSpec, ServeConfig
from mlxd.daemon.footprint import footprint
from tests.e2e.conftest import Daemon, child_pids, free_port, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]


def test_sigterm_leaves_no_child_and_no_socket(tiny_model: Path) -> None:
    daemon = start_daemon(tiny_model)
    workers = daemon.children()
    assert workers, "the daemon should have a worker child"
    sock = Path(daemon.worker_endpoint().removeprefix("ipc://"))
    assert sock.exists()
    assert stop_daemon(daemon) == 0
    time.sleep(0.2)
    assert not [p for p in workers if Path(f"/proc/{p}").exists() and _alive(p)]
    assert not sock.exists() and not sock.parent.exists()


def test_the_worker_starts_before_the_gateway_does(tiny_model: Path, tmp_path: Path) -> None:
    """Spawned before the gateway's imports, so the worker's (seconds) overlap them."""
    log = tmp_path / "start.log"
    with log.open("w") as err:
        daemon = start_daemon(tiny_model, "--log-level", "info", stderr=err)
        stop_daemon(daemon)
    text = log.read_text()
    spawned, server = text.find("started worker for tiny"), text.find("Started server process")
    assert 0 <= spawned < server, text


def test_a_pinned_model_that_does_not_fit_fails_the_start_and_leaves_no_worker(
    tiny_model: Path, tmp_path: Path
) -> None:
    spec = ModelSpec(name="x", path=str(tiny_model))
    size = footprint(spec, ServeConfig(models=(spec,), max_context=512)).total_bytes
    config = tmp_path / "mlxd.toml"
    config.write_text(f"""
max_memory = "{size * 3 // 2}B"
[models.first-pinned]
path = "{tiny_model}"
pinned = true
[models.second-pinned]
path = "{tiny_model}"
pinned = true
""")
    cmd = [sys.executable, "-m", "mlxd", "start", "--config", str(config)]
    cmd += ["--port", str(free_port()), "--max-context", "512", "--log-level", "warning"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}  # one GPU: one budget for both
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "the pinned model 'second-pinned' does not fit" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not _processes_naming("first-pinned")  # spawned, then taken down with the start


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            pass
    return [p for p in found if _alive(p)]


def test_runtime_dir_is_private(shared_daemon: Daemon) -> None:
    rundir = Path(shared_daemon.worker_endpoint().removeprefix("ipc://")).parent
    assert rundir.stat().st_mode & 0o777 == 0o700


def test_second_start_on_a_busy_port_fails_with_one_line(
    tiny_model: Path, shared_daemon: Daemon
) -> None:
    port = shared_daemon.base_url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "mlxd", "start", "--model", str(tiny_model), "--port", port]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # refused before it touched anything: the daemon on that port still serves
    assert httpx.get(f"{shared_daemon.base_url}/health", timeout=10).status_code == 200


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killed_daemon_takes_its_worker_down(tiny_model: Path) -> None:
    daemon = start_daemon(tiny_model)
    workers = child_pids(daemon.proc.pid)
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers)
