"""Workers attached with ``--worker NAME=ENDPOINT``: run on another host, only pinged from here.

They are never spawned, restarted or unloaded by this daemon. A hung one is failed over to its
clients and waited for (``starting``) until it answers again; one whose steps all fail is marked
failed until its pongs say they work again.
"""

from __future__ import annotations

import logging
import time

from mlxd.config import HeartbeatLimits
from mlxd.daemon.heartbeat import is_due, liveness
from mlxd.daemon.worker_process import WorkerProcess
from mlxd.errors import WorkerUnavailable

log = logging.getLogger("mlxd.supervisor")

ATTACH_WAIT_S = 10.0  # at start, for --worker peers; the watcher keeps trying after that


async def attach(worker: WorkerProcess, wait_s: float) -> None:
    """Ping an attached worker until it answers (at most ``wait_s``): then it is ready."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await worker.client.ping(timeout_s=1.0)
        except WorkerUnavailable:
            if time.monotonic() >= deadline:
                worker.last_error = f"no answer from {worker.endpoint}"
                return
            continue
        worker.last_error = ""
        worker.mark_ready()
        log.info("attached worker for %s at %s is ready", worker.spec.name, worker.endpoint)
        return


async def check_attached(worker: WorkerProcess, config: HeartbeatLimits) -> None:
    """One watcher pass over an attached worker: attach, heartbeat, fail or recover it."""
    if worker.state == "starting":
        await attach(worker, 0.0)
        return
    if worker.state not in ("ready", "failed") or not is_due(worker, config):
        return
    why, failing = await liveness(worker, config)
    if why:  # it cannot be restarted from here: fail and wait for it
        log.error("attached worker for %s at %s %s", worker.spec.name, worker.endpoint, why)
        worker.state, worker.last_error = "starting", why
        worker.ready.clear()
        worker.client.fail_all(
            WorkerUnavailable(f"the attached worker for {worker.spec.name!r} {why}")
        )
    elif failing and worker.state == "ready":
        worker.fail(failing)  # until its pongs say its steps work again
    elif not failing and worker.state == "failed":
        worker.state, worker.last_error = "ready", ""
        log.info("attached worker for %s at %s works again", worker.spec.name, worker.endpoint)
