"""One model's worker slot: its process handle, its clients, its state and restart history.

The process side follows uvicorn's ``Process``: spawn, SIGTERM with a grace period, then
SIGKILL. Policy (when to restart, what to unload) lives in the supervisor and its helpers; this
file only says what a slot holds and how its process is started and stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxd.config import ModelSpec
from mlxd.daemon.footprint import Footprint
from mlxd.errors import WorkerUnavailable
from mlxd.gateway.backends.local.control import ControlClient, WorkerInfo
from mlxd.gateway.backends.local.workers import WorkerClient

log = logging.getLogger("mlxd.supervisor")

STOP_GRACE_S = 10.0
# Spawned and not serving yet: loading its model, then warming up (worker/warmup.py).
LOADING = ("starting", "warming")
STARTUP_FAILURE = 3  # the worker's exit code when it cannot load (mlxd.worker.main)


@dataclass(eq=False)
class WorkerProcess:
    """One model's worker: its process, its data-plane client and its restart history."""

    spec: ModelSpec
    endpoint: str
    client: WorkerClient
    control: ControlClient
    heartbeat: ControlClient  # its own socket: an admin command in flight never delays a ping
    size: Footprint
    attached: bool = False  # runs elsewhere (--worker): pinged, never spawned or unloaded
    replica: int = 0  # which of its model's replicas (0 unless --replicas or several --worker)
    proc: subprocess.Popen[bytes] | None = None
    state: str = "unloaded"  # unloaded | starting | warming | ready | stopping | failed | stopped
    progress: str = ""  # while warming: what it builds (worker/warmup.py)
    started_at: float = 0.0
    last_used: float = 0.0
    # How long it may stay idle as its model's latest request asked (Ollama's keep_alive, in
    # seconds; negative: forever); None: the server's keep-alive. Its unload resets it.
    keep_alive_s: float | None = None
    restarts: int = 0
    recovering: bool = False  # starting again after a crash: fallbacks serve meanwhile
    start_failures: int = 0
    crashes: list[float] = field(default_factory=list)  # when, within the crash window
    last_error: str = ""
    reason_file: Path | None = None  # where the worker says why it could not start
    last_pong: float = 0.0
    gpus: str = ""  # the CUDA_VISIBLE_DEVICES it is spawned with (mlxd.gpus; "": none)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def info(self, keep_alive_s: float) -> WorkerInfo:
        """The slot as ``/admin/status`` and ``mlxd ps`` show it."""
        pid = self.proc.pid if self.proc is not None else None
        now = time.monotonic()
        idle = self.state == "ready" and not self.client.in_flight
        return WorkerInfo(
            state=self.state,
            name=self.spec.name,
            pid=pid,
            restarts=self.restarts,
            last_error=self.last_error,
            memory_bytes=self.size.total_bytes,
            weights_bytes=self.size.weights_bytes,
            kv_bytes=self.size.kv_bytes,
            pinned=self.spec.pinned,
            keep_alive_s=keep_alive_s,
            aliases=list(self.spec.aliases),
            in_flight=self.client.in_flight,
            uptime_s=now - self.started_at if self.state == "ready" else None,
            idle_s=now - self.last_used if idle else None,
            gpus=self.gpus,
            path="" if self.attached else self.spec.path,
            progress=self.progress if self.state == "warming" else "",
            vision_weights_bytes=self.size.vision_weights_bytes,
            encoder_peak_bytes=self.size.encoder_peak_bytes,
        )

    def spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``cmd`` (``mlxd worker serve …``) with ``env`` added to this process's
        environment (its GPUs: ``mlxd.gpus``); the slot is ``starting`` until its pong."""
        if self.reason_file is not None:
            self.reason_file.unlink(missing_ok=True)
        full_env = dict(os.environ, **env) if env else None
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=full_env)
        self.state = "starting"
        self.ready.clear()
        log.info("started worker for %s (pid %d)", self.spec.name, self.proc.pid)

    def mark_ready(self) -> None:
        """It answered: ready to serve, and its clocks start now."""
        self.state, self.recovering, self.progress = "ready", False, ""
        self.started_at = self.last_pong = self.last_used = time.monotonic()
        self.ready.set()

    def fail(self, reason: str) -> None:
        """Mark it failed: not restarted, reported by ``/health``, its requests get 503s
        naming ``reason`` at once, until ``load`` (``mlxd load MODEL``) tries again."""
        self.state, self.last_error = "failed", reason
        self.ready.set()  # wake waiters so they fail fast
        self.client.fail_all(
            WorkerUnavailable(f"the worker for {self.spec.name!r} is failed: {reason}")
        )
        log.error(
            "%s failed: %s (not restarted; `mlxd load %s` tries again)",
            self.spec.name,
            reason,
            self.spec.name,
        )

    def kill(self) -> None:
        """SIGKILL, at once (a hung worker); the watcher then sees the exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    async def terminate(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE_S``; the slot is ``stopped`` unless it was
        ``stopping`` or ``failed``."""
        proc = self.proc
        if self.state not in ("stopping", "failed"):
            self.state = "stopped"
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            log.warning("worker for %s ignored SIGTERM; killing it", self.spec.name)
            proc.kill()
            proc.wait()

    def startup_reason(self) -> str:
        """Why it refused to load, from the one line it left in its reason file."""
        try:
            with open(self.reason_file or "", encoding="utf-8", errors="replace") as f:
                reason = " ".join(f.read(1000).split())
        except OSError:
            reason = ""
        return reason or f"exited with code {STARTUP_FAILURE} (see the log)"
