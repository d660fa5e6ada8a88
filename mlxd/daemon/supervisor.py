"""Spawn, watch and restart worker processes; the gateway's ``WorkerPool`` for spawned workers.

Shaped like uvicorn's multiprocess supervisor, but on the gateway's event loop: one watcher task
checks each worker's process and heartbeat every half second. A worker that exits (exception,
SIGKILL, native abort), stops answering pings, or whose engine is stuck in one step past
``--step-timeout`` has its in-flight requests failed at once and is restarted with backoff. A
model is marked failed, with the reason, and not restarted again until ``mlxd load`` when its
worker crashes ``--max-crashes`` times within ``--crash-window``, keeps dying at start, refuses
to load (exit code 3; its reason file says why), or reports that every step fails. Pings go to
the worker's control thread, not its engine thread, so a slow step (first CUDA kernel compiles,
a long prefill) is told apart from a hang.

It is also the model pool: every configured model has a worker slot, loaded at start
(``preload``) or by its first request. Each worker reserves its ``Footprint`` against
``--max-memory``; a model that does not fit first unloads least recently used idle workers (never
pinned or busy ones), else the request gets ``MemoryBudgetExceeded`` (503). Idle workers unload
after their keep-alive. Loads and unloads are serialised by one lock, so budget decisions never
race.
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
from typing import Any

from mlxd.config import ModelSpec, SchedulerConfig, ServeConfig
from mlxd.daemon.budget import Resident, evictions
from mlxd.daemon.footprint import Footprint, buffer_cache_bytes, footprint
from mlxd.errors import (
    ConfigError,
    InvalidRequest,
    MemoryBudgetExceeded,
    MlxdError,
    ModelNotFound,
    WorkerUnavailable,
)
from mlxd.gateway.control import ControlClient, WorkerInfo
from mlxd.gateway.workers import WorkerClient
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import Ping, Pong, Shutdown

log = logging.getLogger("mlxd.supervisor")

HEARTBEAT_S = 2.0
ATTACH_WAIT_S = 10.0  # at start, for --worker peers; the watcher keeps trying after that
MAX_START_FAILURES = 3
STOP_GRACE_S = 10.0
MAX_BACKOFF_S = 30.0
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
    proc: subprocess.Popen[bytes] | None = None
    state: str = "unloaded"  # unloaded | starting | ready | stopping | failed | stopped
    started_at: float = 0.0
    last_used: float = 0.0
    restarts: int = 0
    start_failures: int = 0
    crashes: list[float] = field(default_factory=list)  # when, within the crash window
    last_error: str = ""
    reason_file: Path | None = None  # where the worker says why it could not start
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
        self.aliases = {a: spec.name for spec in config.models for a in spec.aliases}
        self._stopping = False
        self._watcher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one load/unload decision at a time
        self._tasks: set[asyncio.Task[None]] = set()

    # WorkerPool API

    def names(self) -> list[str]:
        return list(self.workers)

    def budget(self) -> dict[str, int | None]:
        """``--max-memory`` and how much of it loaded workers reserve, in bytes."""
        return {"max_memory_bytes": self.config.max_memory_bytes,
                "reserved_bytes": sum(w.size.total_bytes for w in self._residents())}  # fmt: skip

    def restarts(self, name: str) -> int:
        worker = self.workers.get(name)
        return 0 if worker is None else worker.restarts

    def control(self, name: str) -> ControlClient:
        return self._worker(name).control

    def info(self, name: str) -> WorkerInfo:
        w = self._worker(name)
        pid = w.proc.pid if w.proc is not None else None
        now = time.monotonic()
        return WorkerInfo(
            state=w.state, name=w.spec.name, pid=pid, restarts=w.restarts, last_error=w.last_error,
            memory_bytes=w.size.total_bytes, weights_bytes=w.size.weights_bytes,
            kv_bytes=w.size.kv_bytes, pinned=w.spec.pinned,
            keep_alive_s=self.config.keep_alive(w.spec), aliases=list(w.spec.aliases),
            in_flight=w.client.in_flight,
            uptime_s=now - w.started_at if w.state == "ready" else None,
            idle_s=now - w.last_used if w.state == "ready" and not w.client.in_flight else None,
        )  # fmt: skip

    async def client(self, name: str) -> WorkerClient:
        worker = self._worker(name)
        worker.last_used = time.monotonic()
        if worker.state != "ready":
            if worker.state in ("failed", "stopped"):  # an operator's `mlxd load` brings it back
                raise WorkerUnavailable(
                    f"the worker for {name!r} is {worker.state}: {worker.last_error}"
                )
            await self.load(worker.spec.name)
        worker.last_used = time.monotonic()
        return worker.client

    async def load(self, name: str, wait: bool = True) -> WorkerInfo:
        """Start ``name``'s worker unless it runs, unloading LRU idle ones to make room.

        Raises:
            MemoryBudgetExceeded: it does not fit and nothing can be unloaded (at once).
            WorkerUnavailable: with ``wait``, it failed or was not ready in time.
        """
        worker = self._worker(name)
        async with self._lock:
            if worker.attached:
                pass  # nothing to start here: wait for its pong
            elif worker.state in ("unloaded", "stopped", "failed"):
                await self._make_room(worker)
                await self._terminate(worker)  # a failing worker may still be exiting
                worker.start_failures, worker.crashes, worker.last_error = 0, [], ""
                self._spawn(worker)
                self._background(self._await_ready(worker))
        if wait:
            await self._wait_ready(worker)
        return self.info(name)

    async def unload(self, name: str, reason: str = "unloaded on request") -> WorkerInfo:
        """Stop ``name``'s worker gracefully (it drains first); it loads again on demand."""
        worker = self._worker(name)
        if worker.attached:
            raise InvalidRequest(f"{worker.spec.name!r} is an attached worker (--worker): stop "
                                 "it on its own host")  # fmt: skip
        async with self._lock:
            await self._unload(worker, reason)
        return self.info(name)

    async def start(self) -> None:
        """Start the preloaded workers (within the budget) and wait until each is ready."""
        for worker in self.workers.values():
            await worker.client.start()
        attached = [w for w in self.workers.values() if w.attached]
        for worker in attached:
            worker.state = "starting"  # until its first pong
        preload = [w for w in self.workers.values()
                   if (w.spec.preload or w.spec.pinned) and not w.attached]  # fmt: skip
        for worker in sorted(preload, key=lambda w: not w.spec.pinned):
            if self._fits(worker):
                self._spawn(worker)
            elif worker.spec.pinned:
                raise ConfigError(f"the pinned model {worker.spec.name!r} does not fit: "
                                  + self._budget_text(worker))  # fmt: skip
            else:
                log.warning("not preloading %s: %s", worker.spec.name, self._budget_text(worker))
        spawned = [w for w in self.workers.values() if w.state == "starting" and not w.attached]
        await asyncio.gather(*(self._await_ready(w) for w in spawned),
                             *(self._attach(w, ATTACH_WAIT_S) for w in attached))  # fmt: skip
        self._watcher = asyncio.create_task(self._watch(), name="supervisor")

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them, SIGKILL stragglers, remove the runtime dir."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._terminate(w) for w in self.workers.values()))
        for worker in self.workers.values():
            worker.client.fail_all(WorkerUnavailable("the server is shutting down"))
            await worker.client.close()
            await worker.control.close()
            await worker.heartbeat.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # Internal helpers

    def _worker(self, name: str) -> WorkerProcess:
        worker = self.workers.get(self.aliases.get(name, name))
        if worker is None:
            raise ModelNotFound(f"the model {name!r} does not exist", param="model")
        return worker

    def _make_worker(self, spec: ModelSpec, index: int) -> WorkerProcess:
        endpoint = spec.endpoint or f"ipc://{self.runtime_dir / f'w{index}.sock'}"
        keys = self.config.curve_keys
        client = WorkerClient(spec.name, endpoint, keys=keys)
        control = ControlClient(spec.name, control_endpoint(endpoint), keys=keys)
        heartbeat = control.sibling()  # its own connection: a ping never queues behind a command
        attached = spec.endpoint is not None
        size = Footprint(0, 0, 0) if attached else footprint(spec, self.config)
        return WorkerProcess(spec=spec, endpoint=endpoint, client=client, control=control,
                             heartbeat=heartbeat, size=size, attached=attached,
                             reason_file=self.runtime_dir / f"w{index}.reason")  # fmt: skip

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _residents(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.state in ("starting", "ready", "stopping")]

    def _fits(self, worker: WorkerProcess) -> bool:
        budget = self.config.max_memory_bytes
        used = sum(w.size.total_bytes for w in self._residents() if w is not worker)
        return budget is None or used + worker.size.total_bytes <= budget

    async def _make_room(self, worker: WorkerProcess) -> None:
        budget = self.config.max_memory_bytes
        if budget is None:
            return
        residents = [Resident(w.spec.name, w.size.total_bytes, w.last_used,
                              evictable=w.state == "ready" and not w.spec.pinned
                              and not w.client.in_flight and not w.attached)
                     for w in self._residents() if w is not worker]  # fmt: skip
        victims = evictions(worker.size.total_bytes, budget, residents)
        if victims is None:
            raise MemoryBudgetExceeded(f"cannot load {worker.spec.name!r}: "
                                       + self._budget_text(worker))  # fmt: skip
        for name in victims:
            log.info("unloading %s (least recently used) to make room for %s", name,
                     worker.spec.name)  # fmt: skip
            await self._unload(self.workers[name], f"unloaded to make room for {worker.spec.name}")

    def _budget_text(self, worker: WorkerProcess) -> str:
        s, budget = worker.size, self.config.max_memory_bytes or 0
        others = [w for w in self._residents() if w is not worker]
        used = sum(w.size.total_bytes for w in others)
        busy = [w.spec.name for w in others if w.spec.pinned or w.client.in_flight
                or w.state != "ready"]  # fmt: skip
        return (f"it needs {_gb(s.total_bytes)} (weights {_gb(s.weights_bytes)}, KV "
                f"{_gb(s.kv_bytes)}, headroom {_gb(s.headroom_bytes)}); the --max-memory budget "
                f"is {_gb(budget)}, {_gb(used)} of it held by models that cannot be unloaded "
                f"now ({', '.join(busy) or 'none'})")  # fmt: skip

    async def _wait_ready(self, worker: WorkerProcess) -> None:
        timeout = self.config.worker_start_timeout_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while worker.state not in ("ready", "failed", "stopped", "unloaded"):
                    await worker.ready.wait()
                    if worker.state != "ready":
                        await asyncio.sleep(0.05)  # woken by a restart in progress
        if worker.state != "ready":
            why = worker.last_error or f"not ready within {timeout:g} s"
            raise WorkerUnavailable(f"the worker for {worker.spec.name!r} is {worker.state}: "
                                    f"{why}")  # fmt: skip

    async def _unload(self, worker: WorkerProcess, reason: str) -> None:
        if worker.state in ("unloaded", "stopped", "failed") and worker.proc is None:
            return
        worker.state = "stopping"
        proc = worker.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(MlxdError):  # it drains, then exits 0
                await worker.control.request(Shutdown(request_id=worker.control.next_id()))
            deadline = time.monotonic() + self.config.drain_timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        await self._terminate(worker)
        worker.client.fail_all(WorkerUnavailable(f"the worker for {worker.spec.name!r} was "
                                                 f"unloaded ({reason})"))  # fmt: skip
        worker.proc, worker.state, worker.last_error = None, "unloaded", reason
        worker.ready.set()
        log.info("unloaded %s: %s", worker.spec.name, reason)

    def _spawn(self, worker: WorkerProcess) -> None:
        cmd = [sys.executable, "-m", "mlxd", "worker", "serve", *self._worker_args(worker)]
        if worker.reason_file is not None:
            worker.reason_file.unlink(missing_ok=True)
            cmd += ["--reason-file", str(worker.reason_file)]
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
        c = self.config.cache
        args += ["--kv-block-size", str(c.block_size), "--paged-kv" if c.paged else "--no-paged-kv"]
        budgets = (worker.spec.kv_cache_gb, self.config.kv_cache_gb, c.kv_cache_gb)
        kv_gb = next((gb for gb in budgets if gb is not None), None)  # the model's, then global
        if kv_gb is None and self.config.max_memory_bytes is not None:
            kv_gb = worker.size.kv_bytes / 2**30  # what the budget reserved: hold it to that
        if kv_gb is not None:
            args += ["--kv-cache-gb", str(kv_gb)]
        if self.config.max_memory_bytes is not None:  # hold the buffer cache to the reservation
            args += ["--buffer-cache-gb", str(buffer_cache_bytes(worker.size) / 2**30)]
        return [*args, "--dtype", worker.spec.dtype or self.config.dtype]

    async def _await_ready(self, worker: WorkerProcess) -> None:
        deadline = time.monotonic() + self.config.worker_start_timeout_s
        while time.monotonic() < deadline and worker.proc is not None:
            if worker.proc.poll() is not None:
                self._on_exit(worker)
                return
            with contextlib.suppress(WorkerUnavailable):
                await worker.client.ping(timeout_s=1.0)
                if worker.state != "starting":  # unloaded meanwhile
                    return
                worker.state, worker.last_pong = "ready", time.monotonic()
                worker.started_at = worker.last_used = worker.last_pong
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
                self._check_idle(worker)

    def _check_idle(self, worker: WorkerProcess) -> None:
        now = time.monotonic()
        if worker.state != "ready" or worker.attached:
            return
        if worker.client.in_flight:
            worker.last_used = now
            return
        keep_alive = self.config.keep_alive(worker.spec)
        if keep_alive > 0 and not worker.spec.pinned and now - worker.last_used > keep_alive:
            self._background(self._unload_idle(worker, keep_alive))

    async def _unload_idle(self, worker: WorkerProcess, keep_alive: float) -> None:
        async with self._lock:
            idle = time.monotonic() - worker.last_used > keep_alive
            if worker.state == "ready" and not worker.client.in_flight and idle:
                await self._unload(worker, f"idle for {keep_alive:g} s (keep-alive)")

    async def _attach(self, worker: WorkerProcess, wait_s: float) -> None:
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
            worker.state, worker.last_error = "ready", ""
            worker.started_at = worker.last_pong = worker.last_used = time.monotonic()
            worker.ready.set()
            log.info("attached worker for %s at %s is ready", worker.spec.name, worker.endpoint)
            return

    async def _check_attached(self, worker: WorkerProcess) -> None:
        if worker.state == "starting":
            await self._attach(worker, 0.0)
            return
        interval = min(HEARTBEAT_S, self.config.heartbeat_timeout_s)
        recent = time.monotonic() - worker.last_pong <= interval
        if worker.state not in ("ready", "failed") or recent:
            return
        why, failing = await self._liveness(worker)
        if why:  # it cannot be restarted from here: fail and wait for it
            log.error("attached worker for %s at %s %s", worker.spec.name, worker.endpoint, why)
            worker.state, worker.last_error = "starting", why
            worker.ready.clear()
            worker.client.fail_all(WorkerUnavailable(
                f"the attached worker for {worker.spec.name!r} {why}"))  # fmt: skip
        elif failing and worker.state == "ready":
            self._fail(worker, failing)  # until its pongs say its steps work again
        elif not failing and worker.state == "failed":
            worker.state, worker.last_error = "ready", ""
            log.info("attached worker for %s at %s works again", worker.spec.name, worker.endpoint)

    async def _check(self, worker: WorkerProcess) -> None:
        if worker.attached:
            await self._check_attached(worker)
            return
        if worker.proc is None or worker.state in ("failed", "stopped", "stopping", "unloaded"):
            return
        if worker.proc.poll() is not None:
            self._on_exit(worker)
            return
        interval = min(HEARTBEAT_S, self.config.heartbeat_timeout_s)
        if worker.state == "ready" and time.monotonic() - worker.last_pong > interval:
            await self._heartbeat(worker)

    async def _heartbeat(self, worker: WorkerProcess) -> None:
        why, failing = await self._liveness(worker)
        if worker.proc is None or worker.proc.poll() is not None:
            return  # the process poll sees the exit
        if why:
            log.error("worker for %s %s; killing it", worker.spec.name, why)
            worker.last_error = why
            self._kill(worker)
        elif failing and worker.state == "ready":  # a restart would fail the same way
            self._fail(worker, failing)
            self._background(self._stop_failed(worker))

    async def _liveness(self, worker: WorkerProcess) -> tuple[str, str]:
        """Ping ``worker``'s control thread: why it is hung ("" if it is not) and why its steps
        fail (its ``Pong.failing``: "" while they work)."""
        ping = Ping(request_id=worker.heartbeat.next_id())
        try:
            pong = await worker.heartbeat.request(ping, timeout_s=self.config.heartbeat_timeout_s)
        except WorkerUnavailable:
            return "stopped answering heartbeats", ""
        except MlxdError as exc:  # it answered, so it is alive; say what it said
            log.warning("worker for %s answered a ping with: %s", worker.spec.name, exc.message)
            pong = None
        worker.last_pong = time.monotonic()
        if not isinstance(pong, Pong):
            return "", ""
        if pong.busy_s > self.config.step_timeout_s:
            return f"has been stuck in one engine step for {pong.busy_s:.0f} s", ""
        return "", pong.failing

    def _on_exit(self, worker: WorkerProcess) -> None:
        if worker.proc is None or worker.state in ("stopping", "unloaded", "failed"):
            return  # _unload (or _stop_failed) owns this exit
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
        why = self._record_crash(worker, code, was_ready)
        if why:
            self._fail(worker, why)
            return
        worker.restarts += 1
        backoff = self.config.restart_backoff_s * 2 ** (len(worker.crashes) - 1)
        self._background(self._restart(worker, min(MAX_BACKOFF_S, backoff)))

    def _record_crash(self, worker: WorkerProcess, code: int | None, was_ready: bool) -> str:
        """Count an exit nobody asked for: why the model is now failed, or "" to restart it."""
        if code == STARTUP_FAILURE and not was_ready:  # it cannot load: trying again won't help
            return f"refused to load: {self._startup_reason(worker)}"
        now, window = time.monotonic(), self.config.crash_window_s
        worker.crashes = [t for t in worker.crashes if now - t < window] + [now]
        if len(worker.crashes) >= self.config.max_crashes:
            return f"crashed {len(worker.crashes)} times within {window:g} s ({worker.last_error})"
        if worker.start_failures >= MAX_START_FAILURES:
            return f"failed {worker.start_failures} times at start ({worker.last_error})"
        return ""

    def _fail(self, worker: WorkerProcess, reason: str) -> None:
        """Mark ``worker`` failed: not restarted, reported by ``/health``, its requests get 503s
        naming ``reason`` at once, until ``load`` (``mlxd load MODEL``) tries again."""
        worker.state, worker.last_error = "failed", reason
        worker.ready.set()  # wake waiters so they fail fast
        worker.client.fail_all(WorkerUnavailable(f"the worker for {worker.spec.name!r} is failed: "
                                                 f"{reason}"))  # fmt: skip
        log.error("%s failed: %s (not restarted; `mlxd load %s` tries again)", worker.spec.name,
                  reason, worker.spec.name)  # fmt: skip

    def _startup_reason(self, worker: WorkerProcess) -> str:
        path = worker.reason_file
        try:
            with open(path or "", encoding="utf-8", errors="replace") as f:
                reason = " ".join(f.read(1000).split())
        except OSError:
            reason = ""
        return reason or f"exited with code {STARTUP_FAILURE} (see the log)"

    async def _stop_failed(self, worker: WorkerProcess) -> None:
        proc = worker.proc
        await self._terminate(worker)
        if worker.proc is proc:  # not reloaded meanwhile
            worker.proc = None

    async def _restart(self, worker: WorkerProcess, delay: float) -> None:
        worker.state = "starting"
        await asyncio.sleep(delay)
        if self._stopping or worker.state != "starting" or worker.proc is not None:
            return
        worker.last_error = ""
        self._spawn(worker)
        await self._await_ready(worker)

    def _kill(self, worker: WorkerProcess) -> None:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.kill()

    async def _terminate(self, worker: WorkerProcess) -> None:
        proc = worker.proc
        if worker.state not in ("stopping", "failed"):
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


def _gb(num: int) -> str:
    return f"{num / 2**30:.2f} GB"
