"""When a crashed worker is restarted and when it is failed: counts and backoff, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.config import ModelSpec, RestartLimits, ServeConfig
from mlxd.daemon.restart_policy import MAX_BACKOFF_S, backoff_s, crash_reason
from mlxd.daemon.supervisor import Supervisor
from mlxd.daemon.worker_process import STARTUP_FAILURE, WorkerProcess


@pytest.fixture
def config() -> ServeConfig:
    spec = ModelSpec(name="a", path="org/a")
    return ServeConfig(models=(spec,), max_crashes=3, crash_window_s=60.0, restart_backoff_s=0.5)


@pytest.fixture
def worker(config: ServeConfig, tmp_path: Path) -> WorkerProcess:
    return Supervisor(config, tmp_path).workers["a"]


def test_a_crash_below_the_limit_restarts(worker: WorkerProcess, config: ServeConfig) -> None:
    assert crash_reason(worker, -9, True, config.piece(RestartLimits)) == ""
    assert len(worker.crashes) == 1


def test_max_crashes_within_the_window_fail_it(worker: WorkerProcess, config: ServeConfig) -> None:
    worker.last_error = "exited with code -9"
    reasons = [crash_reason(worker, -9, True, config.piece(RestartLimits)) for _ in range(3)]
    assert reasons[:2] == ["", ""]
    assert reasons[2] == "crashed 3 times within 60 s (exited with code -9)"


def test_a_refusal_to_load_fails_it_with_its_reason(
    worker: WorkerProcess, config: ServeConfig
) -> None:
    assert worker.reason_file is not None
    worker.reason_file.write_text("no such model\n")
    why = crash_reason(worker, STARTUP_FAILURE, False, config.piece(RestartLimits))
    assert why == "refused to load: no such model"


def test_backoff_doubles_per_crash_up_to_the_cap(
    worker: WorkerProcess, config: ServeConfig
) -> None:
    delays = []
    for crashes in (1, 2, 3, 10):
        worker.crashes = [0.0] * crashes
        delays.append(backoff_s(worker, config.piece(RestartLimits)))
    assert delays == [0.5, 1.0, 2.0, MAX_BACKOFF_S]
