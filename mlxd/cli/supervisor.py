"""Spawn, watch and restart worker processes; the gateway's ``WorkerPool`` for spawned workers.

Shaped like uvicorn's multiprocess supervisor, but on the gateway's event loop: one watcher task
checks each worker's process and heartbeat every half second. A worker that exits (exception,
SIGKILL, native abort) or stops answering pings has its in-flight requests failed at once and is
restarted with backoff; one that keeps dying at start is marked failed and not retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxd.config import ModelSpec, SchedulerConfig, ServeConfig
from mlxd.errors import ModelNotFound, WorkerUnavailable
from mlxd.gateway.control import ControlClient, WorkerInfo
from mlxd.gateway.workers import WorkerClient
from mlxd.protocol.channel import control_endpoint

log = logging.getLogger("mlxd.supervisor")

HEARTBEAT_S = 2.0
MAX_START_FAILURES = 3
STOP_GRACE_S = 10.0


@dataclass(eq=False)
class WorkerProcess:
    """One model's worker: its process, its data-plane client and its restart history."""

    spec: ModelSpec
    endpoint: str
    client: WorkerClient
    control: ControlClient
    proc: subprocess.Popen[bytes] | None = None
    state: str = "stopped"  # starting | ready | failed | stopped
    restarts: int = 0
    start_failures: int = 0
    last_error: str = ""
    last_pong: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    """Runs one worker process per configured model and keeps them alive."""

    def __init__(self, config: ServeConfig, runtime_dir: Path, log_level: str = "INFO") -> None:
        self.config = config
        self.runtime_dir = runtime_dir
        self.log_level = log_level
        self.workers = {
            spec.name: self._make_worker(spec, i) for i, spec in enumerate(config.models)
        }
        self._stopping = False
        self._watcher: asyncio.Task[None] | None = None

    # WorkerPool API

    def names(self) -> list[str]:
        return list(self.workers)

    def restarts(self, name: str) -> int:
        worker = self.workers.get(name)
        return 0 if worker is None else worker.restarts

    def control(self, name: str) -> ControlClient:
        return self._worker(name).control

    def info(self, name: str) -> WorkerInfo:
        w = self._worker(name)
        pid = w.proc.pid if w.proc is not None else None
        return WorkerInfo(state=w.state, pid=pid, restarts=w.restarts, last_error=w.last_error)

    async def client(self, name: str) -> WorkerClient:
        worker = self.workers.get(name)
        if worker is None:
            raise ModelNotFound(f"the model {name!r} does not exist", param="model")
        if worker.state in ("failed", "stopped"):
            raise WorkerUnavailable(f"the worker for {name!r} {worker.state}: {worker.last_error}")
        if worker.state != "ready":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.ready.wait(), self.config.worker_start_timeout_s)
        if worker.state != "ready":
            raise WorkerUnavailable(f"the worker for {name!r} is not ready")
        return worker.client

    async def start(self) -> None:
        """Start every worker and wait until each is ready (or has failed)."""
        for worker in self.workers.values():
            await worker.client.start()
            self._spawn(worker)
        await asyncio.gather(*(self._await_ready(w) for w in self.workers.values()))
        self._watcher = asyncio.create_task(self._watch(), name="supervisor")

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them, SIGKILL stragglers, remove the runtime dir."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await asyncio.gather(*(self._terminate(w) for w in self.workers.values()))
        for worker in self.workers.values():
            worker.client.fail_all(WorkerUnavailable("the server is shutting down"))
            await worker.client.close()
            await worker.control.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # Internal helpers

    def _worker(self, name: str) -> WorkerProcess:
        worker = self.workers.get(name)
        if worker is None:
            raise ModelNotFound(f"the model {name!r} does not exist", param="model")
        return worker

    def _make_worker(self, spec: ModelSpec, index: int) -> WorkerProcess:
        endpoint = f"ipc://{self.runtime_dir / f'w{index}.sock'}"
        client = WorkerClient(spec.name, endpoint)
        control = ControlClient(spec.name, control_endpoint(endpoint))
        return WorkerProcess(spec=spec, endpoint=endpoint, client=client, control=control)

    def _spawn(self, worker: WorkerProcess) -> None:
        cmd = [sys.executable, "-m", "mlxd", "worker", "serve", *self._worker_args(worker)]
        worker.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        worker.state = "starting"
        worker.ready.clear()
        log.info("started worker for %s (pid %d)", worker.spec.name, worker.proc.pid)

    def _worker_args(self, worker: WorkerProcess) -> list[str]:
        s: SchedulerConfig = self.config.scheduler
        args = [
            "--model",
            worker.spec.path,
            "--name",
            worker.spec.name,
            "--bind",
            worker.endpoint,
            "--control",
            worker.control.endpoint,
            "--parent-pid",
            str(os.getpid()),
            "--log-level",
            self.log_level,
            "--max-num-seqs",
            str(s.max_num_seqs),
            "--max-queued",
            str(s.max_queued),
            "--prefill-chunk",
            str(s.prefill_chunk),
            "--stream-interval",
            str(s.stream_interval),
            "--priority-aging",
            str(s.aging_s),
        ]
        if self.config.max_context:
            args += ["--max-context", str(self.config.max_context)]
        return args

    async def _await_ready(self, worker: WorkerProcess) -> None:
        deadline = time.monotonic() + self.config.worker_start_timeout_s
        while time.monotonic() < deadline and worker.proc is not None:
            if worker.proc.poll() is not None:
                self._on_exit(worker)
                return
            with contextlib.suppress(WorkerUnavailable):
                await worker.client.ping(timeout_s=1.0)
                worker.state, worker.last_pong = "ready", time.monotonic()
                worker.start_failures = 0
                worker.ready.set()
                log.info("worker for %s is ready", worker.spec.name)
                return
        if worker.state == "starting":
            worker.last_error = "did not become ready in time"
            self._kill(worker)

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.5)
            for worker in self.workers.values():
                await self._check(worker)

    async def _check(self, worker: WorkerProcess) -> None:
        if worker.proc is None or worker.state in ("failed", "stopped"):
            return
        if worker.proc.poll() is not None:
            self._on_exit(worker)
            return
        interval = min(HEARTBEAT_S, self.config.heartbeat_timeout_s)
        if worker.state == "ready" and time.monotonic() - worker.last_pong > interval:
            await self._heartbeat(worker)

    async def _heartbeat(self, worker: WorkerProcess) -> None:
        try:
            await worker.client.ping(timeout_s=self.config.heartbeat_timeout_s)
            worker.last_pong = time.monotonic()
        except WorkerUnavailable:
            if worker.proc is not None and worker.proc.poll() is None:
                log.error("worker for %s stopped answering; killing it", worker.spec.name)
                worker.last_error = "stopped answering heartbeats"
                self._kill(worker)

    def _on_exit(self, worker: WorkerProcess) -> None:
        assert worker.proc is not None
        code = worker.proc.returncode
        was_ready = worker.state == "ready"
        worker.last_error = worker.last_error or f"exited with code {code}"
        log.error("worker for %s %s", worker.spec.name, worker.last_error)
        worker.client.fail_all(
            WorkerUnavailable(f"the worker for {worker.spec.name!r} crashed ({worker.last_error})")
        )
        worker.proc = None
        worker.start_failures = 0 if was_ready else worker.start_failures + 1
        if self._stopping:
            return
        if code == 0 and was_ready:  # it was told to stop (admin shutdown, SIGTERM): stay down
            worker.state, worker.last_error = "stopped", "shut down on request"
            worker.ready.set()  # wake waiters so they fail fast
            return
        if worker.start_failures >= MAX_START_FAILURES:
            worker.state = "failed"
            worker.ready.set()  # wake waiters so they fail fast
            log.error("worker for %s failed %d times at start; giving up", worker.spec.name,
                      worker.start_failures)  # fmt: skip
            return
        worker.restarts += 1
        asyncio.get_running_loop().create_task(self._restart(worker))

    async def _restart(self, worker: WorkerProcess) -> None:
        delay = min(30.0, 0.5 * 2 ** max(0, worker.start_failures))
        worker.state = "starting"
        await asyncio.sleep(delay)
        if self._stopping:
            return
        worker.last_error = ""
        self._spawn(worker)
        await self._await_ready(worker)

    def _kill(self, worker: WorkerProcess) -> None:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.kill()

    async def _terminate(self, worker: WorkerProcess) -> None:
        proc = worker.proc
        worker.state = "stopped"
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            log.warning("worker for %s ignored SIGTERM; killing it", worker.spec.name)
            proc.kill()
            proc.wait()
