"""Placement end to end (issue 40): a model's ``gpus``, the per-GPU ``--max-memory`` budget, and
a model too big for one GPU's budget served by a group on two, on a host that shows the daemon
several "GPUs" (``CUDA_VISIBLE_DEVICES``; the CPU backend ignores them). Every model is the tiny
model under another name, so each lone worker reserves the same footprint F."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlxd.config import ModelSpec, ServeConfig
from mlxd.daemon.footprint import device_share, footprint
from tests.e2e.conftest import Daemon, child_pids, stop_daemon, visible_gpus
from tests.e2e.test_pool import CONTEXT, chat, models, spawn

pytestmark = [pytest.mark.e2e]


def tiny_config(model: Path) -> ServeConfig:
    return ServeConfig(models=(ModelSpec(name="x", path=str(model)),), max_context=CONTEXT)


def ps(d: Daemon) -> str:
    env = {**os.environ, "MLXD_URL": d.base_url}
    cmd = [sys.executable, "-m", "mlxd", "ps"]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env=env, check=True
    ).stdout


def test_models_run_on_their_gpus_each_gpu_with_its_own_budget(
    tiny_model: Path, tmp_path: Path
) -> None:
    """a on GPU 0 and b on GPU 1 both load under a budget of 1.5 F (per GPU); c, also on GPU 1,
    unloads b and not a; d, without gpus, takes the GPU no model names."""
    config = tiny_config(tiny_model)
    f = footprint(config.models[0], config).total_bytes
    path = tmp_path / "mlxd.toml"
    path.write_text(f"""
max_memory = "{f * 3 // 2}B"
[models.a]
path = "{tiny_model}"
gpus = "0"
[models.b]
path = "{tiny_model}"
gpus = [1]
[models.c]
path = "{tiny_model}"
gpus = "1"
preload = false
[models.d]
path = "{tiny_model}"
preload = false
""")
    d = spawn(path, env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    try:
        status = models(d)
        assert {n: m["gpus"] for n, m in status.items()} == {"a": "0", "b": "1", "c": "1", "d": "2"}
        assert [status[n]["state"] for n in "ab"] == ["ready", "ready"]
        assert visible_gpus(status["b"]["pid"]) == "1"
        table = ps(d)
        assert re.search(r"^MODEL\s+STATE\s+PID\s+GPUS\s", table, re.M), table
        assert re.search(rf"^b\s+\w+\s+{status['b']['pid']}\s+1\s", table, re.M), table
        assert re.search(r"^d\s+unloaded\s+-\s+2\s", table, re.M), table
        assert chat(d, "c") in ("length", "stop")  # GPU 1 full: b goes, a on GPU 0 stays
        state = {n: m["state"] for n, m in models(d).items()}
        assert state == {"a": "ready", "b": "unloaded", "c": "ready", "d": "unloaded"}
        assert "make room for c" in models(d)["b"]["last_error"]
    finally:
        assert stop_daemon(d) == 0


def test_a_model_too_big_for_one_gpu_is_served_by_a_group_on_two(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Under a budget below F but above a rank's share of it, the model is a group of two
    ranks (no group_size given), rank 0 on GPUs 0,1 (it uses the first), rank 1 on GPU 1."""
    config = tiny_config(tiny_model)
    size = footprint(config.models[0], config)
    share = device_share(size, 2).total_bytes
    assert share < size.total_bytes
    path = tmp_path / "mlxd.toml"
    path.write_text(f"""
max_memory = "{(share + size.total_bytes) // 2}B"
[models.big]
path = "{tiny_model}"
distributed = "ring"
""")
    d = spawn(path, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    try:
        big = models(d)["big"]
        assert (big["state"], big["gpus"]) == ("ready", "0,1")
        pid, worker = d.worker_pid("big"), d.worker_config("big")
        assert (worker.group_size, worker.distributed) == (2, "ring")
        (rank1,) = child_pids(pid)
        assert [visible_gpus(pid), visible_gpus(rank1)] == ["0,1", "1"]
        assert chat(d, "big") in ("length", "stop")
        assert re.search(r"^big\s+\w+\s+\d+\s+0,1\s", ps(d), re.M)
    finally:
        assert stop_daemon(d) == 0
