"""A worker group as it runs across two Macs, on one host: ``mlx.launch`` (MLX's launcher, ring
backend, a hostfile of two localhost ranks) starts `mlxd worker serve` on each "host", and
`mlxd start --worker` attaches rank 0 (docs/ARCHITECTURE.md, "A group across two Macs"). The
ranks find each other from the launcher's environment alone (``MLX_RANK``, ``MLX_HOSTFILE``),
not from rank 0 starting them as ``--group-size`` does (tests/e2e/test_worker_group.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon, free_port, stop_daemon, wait_healthy
from tests.e2e.test_worker_group import PROMPTS, greedy

pytestmark = [pytest.mark.e2e]

LAUNCH = Path(sys.executable).with_name("mlx.launch")


@pytest.fixture(scope="module")
def launched(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Path]]:
    """Two ranks by ``mlx.launch --backend ring``, rank 0 attached to a daemon; their log."""
    endpoint = f"ipc://{tmp_path_factory.mktemp('launch') / 'w.sock'}"
    worker = [sys.executable, "-m", "mlxd", "worker", "serve", "--model", str(tiny_model)]
    worker += ["--name", "tiny", "--bind", endpoint, "--max-context", "512"]
    ports = ["--starting-port", str(free_port())]
    hosts = ["--hosts", "127.0.0.1", "-n", "2", "--backend", "ring"]
    cmd = [str(LAUNCH), *hosts, *ports, "--", *worker]
    log = endpoint[len("ipc://") :] + ".log"
    with open(log, "wb") as out:  # its own process group: stopped together
        ranks = subprocess.Popen(cmd, stderr=out, start_new_session=True)
    try:
        port = free_port()
        start = [sys.executable, "-m", "mlxd", "start", "--worker", f"tiny={endpoint}"]
        start += ["--port", str(port), "--log-level", "warning"]
        gateway = subprocess.Popen(start)
        d = wait_healthy(Daemon(gateway, f"http://127.0.0.1:{port}", "tiny", tiny_model))
        yield d, Path(log)
        assert stop_daemon(d) == 0
    finally:
        os.killpg(ranks.pid, signal.SIGTERM)
        ranks.wait(timeout=30)


def test_two_ranks_launched_by_mlx_launch_answer_as_one_process(
    launched: tuple[Daemon, Path], shared_daemon: Daemon
) -> None:
    d, log = launched
    assert d.admin_get("/admin/status").json()["models"][0]["state"] == "ready"
    ranks = log.read_text()
    assert "rank 0 of 2 (ring)" in ranks and "rank 1 of 2 (ring)" in ranks, ranks
    for prompt in PROMPTS[:3]:
        assert greedy(d, prompt) == greedy(shared_daemon, prompt)
