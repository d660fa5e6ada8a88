"""`mlxd start` process lifecycle: clean shutdown, no orphans, no socket files."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, child_pids, start_daemon, stop_daemon

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


def test_runtime_dir_is_private(shared_daemon: Daemon) -> None:
    rundir = Path(shared_daemon.worker_endpoint().removeprefix("ipc://")).parent
    assert rundir.stat().st_mode & 0o777 == 0o700


def test_second_start_on_a_busy_port_fails_with_one_line(
    tiny_model: Path, shared_daemon: Daemon
) -> None:
    import subprocess
    import sys

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
