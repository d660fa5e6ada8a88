"""When a crashed worker is restarted, after how long, and when it is given up as failed.

A model is failed (not restarted until ``mlxd load``) when its worker refuses to load (exit code
``STARTUP_FAILURE``: trying again won't help), crashes ``--max-crashes`` times within
``--crash-window``, or dies ``MAX_START_FAILURES`` times in a row before it is ready. Otherwise it
is restarted after ``--restart-backoff``, doubled for each crash within the window.
"""

from __future__ import annotations

import time

from mlxd.config import RestartLimits
from mlxd.daemon.worker_process import STARTUP_FAILURE, WorkerProcess

MAX_START_FAILURES = 3
MAX_BACKOFF_S = 30.0


def crash_reason(
    worker: WorkerProcess, code: int | None, was_ready: bool, config: RestartLimits
) -> str:
    """Count an exit nobody asked for: why the model is now failed, or "" to restart it."""
    if code == STARTUP_FAILURE and not was_ready:  # it cannot load: trying again won't help
        return f"refused to load: {worker.startup_reason()}"
    now, window = time.monotonic(), config.crash_window_s
    worker.crashes = [t for t in worker.crashes if now - t < window] + [now]
    if len(worker.crashes) >= config.max_crashes:
        return f"crashed {len(worker.crashes)} times within {window:g} s ({worker.last_error})"
    if worker.start_failures >= MAX_START_FAILURES:
        return f"failed {worker.start_failures} times at start ({worker.last_error})"
    return ""


def backoff_s(worker: WorkerProcess, config: RestartLimits) -> float:
    """The wait before the next restart: doubled for each crash within the window, capped."""
    backoff: float = config.restart_backoff_s * 2 ** (len(worker.crashes) - 1)
    return min(MAX_BACKOFF_S, backoff)
