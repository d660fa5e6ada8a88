"""Liveness: ping a worker's control thread and tell a hung worker from a slow or failing one.

Pings go to the control thread, not the engine thread, so a long step (first CUDA kernel
compiles, a long prefill) still gets a pong; the pong's ``busy_s`` then says how long the
engine has been in one step, and ``failing`` why its recent steps all failed.
"""

from __future__ import annotations

import logging
import time

from mlxd.config import HeartbeatLimits
from mlxd.daemon.worker_process import WorkerProcess
from mlxd.errors import MlxdError, WorkerUnavailable
from mlxd.protocol.messages import Ping, Pong

log = logging.getLogger("mlxd.supervisor")

HEARTBEAT_S = 2.0


def is_due(worker: WorkerProcess, config: HeartbeatLimits) -> bool:
    """Whether ``worker`` was last heard from longer than a heartbeat ago."""
    interval = min(HEARTBEAT_S, config.heartbeat_timeout_s)
    return time.monotonic() - worker.last_pong > interval


async def liveness(worker: WorkerProcess, config: HeartbeatLimits) -> tuple[str, str]:
    """Ping ``worker``'s control thread: why it is hung ("" if it is not) and why its steps
    fail (its ``Pong.failing``: "" while they work)."""
    ping = Ping(request_id=worker.heartbeat.next_id())
    try:
        pong = await worker.heartbeat.request(ping, timeout_s=config.heartbeat_timeout_s)
    except WorkerUnavailable:
        return "stopped answering heartbeats", ""
    except MlxdError as exc:  # it answered, so it is alive; say what it said
        log.warning("worker for %s answered a ping with: %s", worker.spec.name, exc.message)
        pong = None
    worker.last_pong = time.monotonic()
    if not isinstance(pong, Pong):
        return "", ""
    if pong.busy_s > config.step_timeout_s:
        return f"has been stuck in one engine step for {pong.busy_s:.0f} s", ""
    return "", pong.failing
