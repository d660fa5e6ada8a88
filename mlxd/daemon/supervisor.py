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
after their keep-alive: the server's, or what the model's latest request asked (``keep_alive``,
Ollama's) until the worker unloads. Loads and unloads are serialised by one lock, so budget
decisions never race.

This file holds the pool and the watcher loop; its parts are beside it: ``worker_process`` (a
slot and its process), ``worker_command`` (the worker's argv), ``heartbeat`` (liveness),
``restart_policy`` (backoff and when to give up), ``budget`` (what fits, what to unload) and
``attach`` (workers on other hosts).

A model may have several replicas (``--replicas N``, or several ``--worker NAME=...``): each is
a slot of its own (process, heartbeat, restarts), ``self.groups`` lists a model's slots, and
the model's client is a ``ReplicaSet`` that routes each request to one ready replica. The model
is ready while one replica is; loading, unloading and keep-alive act on all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from mlxd import gpus
from mlxd.config import HeartbeatLimits, ModelSpec, RestartLimits, ServeConfig
from mlxd.daemon import budget, placement
from mlxd.daemon.attach import ATTACH_WAIT_S, attach, check_attached
from mlxd.daemon.footprint import Footprint, footprint
from mlxd.daemon.heartbeat import is_due, liveness
from mlxd.daemon.restart_policy import backoff_s, crash_reason
from mlxd.daemon.worker_command import CUDA_GRAPHS, worker_command, worker_env
from mlxd.daemon.worker_process import LOADING, WorkerProcess
from mlxd.errors import (
    ConfigError,
    InvalidRequest,
    MemoryBudgetExceeded,
    MlxdError,
    ModelNotFound,
    WorkerUnavailable,
)
from mlxd.gateway.backends.local.control import ControlClient, ReplicaInfo, WorkerInfo
from mlxd.gateway.backends.local.pool import ModelClient
from mlxd.gateway.backends.local.replicas import Replica, ReplicaSet
from mlxd.gateway.backends.local.workers import WorkerClient
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import Ping, Pong, Shutdown

log = logging.getLogger("mlxd.supervisor")

# How often the watcher looks at each worker process: a crash is seen within this, and a model
# with fallbacks fails over then (a poll() per worker: cheap). Heartbeats keep their own period.
WATCH_INTERVAL_S = 0.1
# The shortest idle time before an unload, whatever a request asked (a keep_alive of 0): a
# request holds its worker from taking it (``client``) to sending it its message without
# being in flight, and must not see it unloaded in between.
MIN_IDLE_S = 0.5


class Supervisor:
    """Runs one worker process per configured model and keeps them alive."""

    def __init__(self, config: ServeConfig, runtime_dir: Path, log_level: str = "INFO") -> None:
        self.config = config
        self.restart_limits = config.piece(RestartLimits)
        self.heartbeat_limits = config.piece(HeartbeatLimits)
        self.runtime_dir = runtime_dir
        self.log_level = log_level
        self.groups = {
            spec.name: [self._make_worker(spec, i, r) for r in range(spec.num_replicas)]
            for i, spec in enumerate(config.models)
        }
        self.workers = {name: group[0] for name, group in self.groups.items()}  # replica 0
        self.slots = [w for group in self.groups.values() for w in group]
        self._place(gpus.visible())
        self.replica_sets = {
            name: self._replica_set(name, group)
            for name, group in self.groups.items()
            if len(group) > 1
        }
        self.aliases = {a: spec.name for spec in config.models for a in spec.aliases}
        self._stopping = False
        self._preloaded = False  # ``preload`` ran
        self._watcher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one load/unload decision at a time
        self._tasks: set[asyncio.Task[None]] = set()

    # WorkerPool API

    def names(self) -> list[str]:
        return list(self.workers)

    def budget(self) -> dict[str, int | None]:
        """``--max-memory`` and how much of it loaded workers reserve, in bytes."""
        return {
            "max_memory_bytes": self.config.max_memory_bytes,
            "reserved_bytes": budget.reserved_bytes(self.slots),
        }

    def restarts(self, name: str) -> int:
        return sum(w.restarts for w in self.groups.get(name, ()))

    def control(self, name: str) -> ControlClient:
        return self._worker(name).control

    def info(self, name: str) -> WorkerInfo:
        worker = self._worker(name)
        info = worker.info(self._keep_alive(worker))
        group = self.groups[worker.spec.name]
        if len(group) == 1:
            return info
        return _summary(info, group, self.replica_sets[worker.spec.name])

    async def client(self, name: str) -> ModelClient:
        worker = self._worker(name)
        group = self.groups[worker.spec.name]
        if len(group) > 1 and any(w.state == "ready" for w in group):
            for w in group:
                w.last_used = time.monotonic()
            return self.replica_sets[worker.spec.name]
        worker.last_used = time.monotonic()
        if worker.state != "ready":
            if worker.state in ("failed", "stopped"):  # an operator's `mlxd load` brings it back
                raise WorkerUnavailable(
                    f"the worker for {name!r} is {worker.state}: {worker.last_error}"
                )
            if worker.recovering and worker.spec.fallbacks:  # no wait: the fallbacks serve
                raise WorkerUnavailable(f"the worker for {name!r} is restarting after a crash")
            await self.load(worker.spec.name)
        worker.last_used = time.monotonic()
        return self.replica_sets.get(worker.spec.name) or worker.client

    async def load(self, name: str, wait: bool = True) -> WorkerInfo:
        """Start ``name``'s worker unless it runs, unloading LRU idle ones to make room.

        Raises:
            MemoryBudgetExceeded: it does not fit and nothing can be unloaded (at once).
            WorkerUnavailable: with ``wait``, it failed or was not ready in time.
        """
        group = self.groups[self._worker(name).spec.name]
        async with self._lock:
            for worker in group:
                await self._load(worker)
        if wait:
            await asyncio.gather(*(self._wait_ready(w) for w in group))
        return self.info(name)

    async def unload(self, name: str, reason: str = "unloaded on request") -> WorkerInfo:
        """Stop ``name``'s worker gracefully (it drains first); it loads again on demand."""
        worker = self._worker(name)
        if worker.attached:
            raise InvalidRequest(
                f"{worker.spec.name!r} is an attached worker (--worker): stop it on its own host"
            )
        async with self._lock:
            for replica in self.groups[worker.spec.name]:
                await self._unload(replica, reason)
        return self.info(name)

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """``name``'s idle time before it unloads, as its latest request asked (``None``: the
        server's; 0: once its requests are done; negative: never). Read by the watcher."""
        self._worker(name).keep_alive_s = seconds

    async def start(self) -> None:
        """Start the preloaded workers (within the budget) and wait until each is ready."""
        for worker in self.slots:
            await worker.client.start()
        attached = [w for w in self.slots if w.attached]
        for worker in attached:
            worker.state = "starting"  # until its first pong
        self.preload()
        spawned = [w for w in self.slots if w.state == "starting" and not w.attached]
        await asyncio.gather(
            *(self._await_ready(w) for w in spawned), *(attach(w, ATTACH_WAIT_S) for w in attached)
        )
        self._watcher = asyncio.create_task(self._watch(), name="supervisor")
        for replica_set in self.replica_sets.values():
            self._background(replica_set.poll())

    def preload(self) -> None:
        """Spawn the pinned, then the preload models that fit (a pinned one must), once: the
        daemon calls it before the gateway's imports (``daemon.server``), else ``start``."""
        if self._preloaded:
            return
        self._preloaded = True
        preload = [w for w in self.slots if _preloads(w)]
        max_memory = self.config.max_memory_bytes
        for worker in sorted(preload, key=lambda w: not w.spec.pinned):
            if budget.fits(worker, self.slots, max_memory):
                self._spawn(worker)
                continue
            text = budget.budget_text(worker, self.slots, max_memory)
            if worker.spec.pinned:
                raise ConfigError(f"the pinned model {worker.spec.name!r} does not fit: " + text)
            log.warning("not preloading %s: %s", worker.spec.name, text)

    def cut(self, error: MlxdError) -> None:
        """End every request still running on a worker with ``error``: the daemon stops and
        its drain timeout has passed (``daemon.server``), so each client gets that error as
        its stream's end instead of a connection closed mid-body."""
        for worker in self.slots:
            worker.client.cut(error)

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
        await asyncio.gather(*(w.terminate() for w in self.slots))
        for worker in self.slots:
            worker.client.fail_all(WorkerUnavailable("the server is shutting down"))
            await worker.client.close()
            await worker.control.close()
            await worker.heartbeat.close()
        for replica_set in self.replica_sets.values():
            await replica_set.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def abandon(self) -> None:
        """Kill every worker still running and remove the runtime dir, at once: the daemon's
        last word, which finds nothing left after ``stop`` (its app started and stopped)."""
        for worker in self.slots:
            worker.kill()
            if worker.proc is not None:
                worker.proc.wait()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # Internal helpers: slots and tasks

    def _worker(self, name: str) -> WorkerProcess:
        worker = self.workers.get(self.aliases.get(name, name))
        if worker is None:
            raise ModelNotFound(f"the model {name!r} does not exist", param="model")
        return worker

    def _make_worker(self, spec: ModelSpec, index: int, replica: int = 0) -> WorkerProcess:
        stem = f"w{index}" if replica == 0 else f"w{index}r{replica}"
        endpoint = (
            spec.endpoints[replica]
            if spec.endpoints
            else f"ipc://{self.runtime_dir / f'{stem}.sock'}"
        )
        keys = self.config.curve_keys
        label = spec.name if replica == 0 else f"{spec.name}#{replica}"
        client = WorkerClient(label, endpoint, keys=keys)
        control = ControlClient(spec.name, control_endpoint(endpoint), keys=keys)
        heartbeat = control.sibling()  # its own connection: a ping never queues behind a command
        attached = spec.endpoint is not None
        size = Footprint(0, 0, 0) if attached else footprint(spec, self.config)
        return WorkerProcess(
            spec=spec,
            endpoint=endpoint,
            client=client,
            control=control,
            heartbeat=heartbeat,
            size=size,
            attached=attached,
            replica=replica,
            reason_file=self.runtime_dir / f"{stem}.reason",
        )

    def _place(self, visible: list[str]) -> None:
        """Each slot's GPUs, ranks and backend (daemon/placement.py), set once at start."""
        specs = self.config.models
        sizes = [self.groups[s.name][0].size for s in specs]
        placed = placement.place(specs, sizes, visible, self.config.max_memory_bytes)
        for spec, where in zip(specs, placed, strict=True):
            for worker, p in zip(self.groups[spec.name], where, strict=True):
                worker.gpus = p.gpus
                worker.spec = dataclasses.replace(
                    spec, group_size=p.group_size, distributed=p.distributed
                )

    def _replica_set(self, name: str, group: list[WorkerProcess]) -> ReplicaSet:
        return ReplicaSet(name, [_replica(w) for w in group], self.config.routing)

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, worker: WorkerProcess) -> None:
        env = worker_env(worker, self.config)
        if CUDA_GRAPHS in env:
            log.info("%s: MLX's CUDA graphs off (layers with recurrent state)", worker.spec.name)
        worker.spawn(worker_command(worker, self.config, self.log_level), env)

    # Internal helpers: loading and unloading under the budget

    async def _make_room(self, worker: WorkerProcess) -> None:
        max_memory = self.config.max_memory_bytes
        if max_memory is None:
            return
        victims = budget.victims(worker, self.slots, max_memory)
        if victims is None:
            text = budget.budget_text(worker, self.slots, max_memory)
            raise MemoryBudgetExceeded(f"cannot load {worker.spec.name!r}: " + text)
        near = budget.neighbours(worker, self.slots)  # its GPU's (all, where unplaced)
        for name in dict.fromkeys(victims):  # a model's replicas there go together
            log.info(
                "unloading %s (least recently used) to make room for %s", name, worker.spec.name
            )
            for replica in self.groups[name]:
                if any(replica is w for w in near):
                    await self._unload(replica, f"unloaded to make room for {worker.spec.name}")

    async def _load(self, worker: WorkerProcess) -> None:
        if worker.attached:
            return  # nothing to start here: wait for its pong
        if worker.state in ("unloaded", "stopped", "failed"):
            await self._make_room(worker)
            await worker.terminate()  # a failing worker may still be exiting
            worker.start_failures, worker.crashes, worker.last_error = 0, [], ""
            self._spawn(worker)
            self._background(self._await_ready(worker))

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
            raise WorkerUnavailable(f"the worker for {worker.spec.name!r} is {worker.state}: {why}")

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
        await worker.terminate()
        worker.client.fail_all(
            WorkerUnavailable(f"the worker for {worker.spec.name!r} was unloaded ({reason})")
        )
        worker.proc, worker.state, worker.last_error = None, "unloaded", reason
        worker.keep_alive_s = None  # a request's keep-alive lasts until the unload it asked
        worker.ready.set()
        log.info("unloaded %s: %s", worker.spec.name, reason)

    def _check_idle(self, worker: WorkerProcess) -> None:
        now = time.monotonic()
        if worker.state != "ready" or worker.attached:
            return
        if self._in_flight(worker):
            worker.last_used = now
            return
        if self._is_idle(worker, now):
            self._background(self._unload_idle(worker))

    async def _unload_idle(self, worker: WorkerProcess) -> None:
        async with self._lock:
            # Looked at again: a request may have come, or changed the keep-alive, meanwhile.
            idle = self._is_idle(worker, time.monotonic())
            if worker.state == "ready" and not self._in_flight(worker) and idle:
                why = self._idle_reason(worker)
                await self._unload(worker, why)
                if worker.replica == 0:  # the model's last_used is replica 0's
                    for replica in self.groups[worker.spec.name][1:]:
                        await self._unload(replica, why)

    def _is_idle(self, worker: WorkerProcess, now: float) -> bool:
        """Whether ``worker`` was idle past its keep-alive (never, when pinned)."""
        keep_alive = self._keep_alive(worker)
        return keep_alive > 0 and not worker.spec.pinned and now - worker.last_used > keep_alive

    def _keep_alive(self, worker: WorkerProcess) -> float:
        """``worker``'s idle seconds before it unloads (0: never): what its latest request
        asked (``keep_alive``), else the server's (``--keep-alive``, the model's own)."""
        asked = worker.keep_alive_s
        if asked is None:
            return self.config.keep_alive(worker.spec)
        return 0.0 if asked < 0 else max(asked, MIN_IDLE_S)

    def _idle_reason(self, worker: WorkerProcess) -> str:
        idle = f"idle for {self._keep_alive(worker):g} s"
        if worker.keep_alive_s is None:
            return f"{idle} (keep-alive)"
        return f"{idle} (its last request's keep_alive: {worker.keep_alive_s:g} s)"

    def _in_flight(self, worker: WorkerProcess) -> int:
        """Requests in flight on any replica of ``worker``'s model."""
        return sum(w.client.in_flight for w in self.groups[worker.spec.name])

    # Internal helpers: the watcher (start, heartbeat, exit, restart)

    async def _await_ready(self, worker: WorkerProcess) -> None:
        deadline = time.monotonic() + self.config.worker_start_timeout_s
        while time.monotonic() < deadline and worker.proc is not None:
            if worker.proc.poll() is not None:
                self._on_exit(worker)
                return
            with contextlib.suppress(WorkerUnavailable):
                await worker.client.ping(timeout_s=1.0)
                if worker.state not in LOADING:  # unloaded meanwhile
                    return
                worker.start_failures = 0
                worker.mark_ready()
                log.info("worker for %s is ready", worker.spec.name)
                return
            await _note_warming(worker)
        if worker.state in LOADING:
            worker.last_error = "did not become ready in time"
            worker.kill()

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for worker in self.slots:
                await self._check(worker)
            for worker in self.workers.values():
                self._check_idle(worker)

    async def _check(self, worker: WorkerProcess) -> None:
        if worker.attached:
            await check_attached(worker, self.heartbeat_limits)
            return
        if worker.proc is None or worker.state in ("failed", "stopped", "stopping", "unloaded"):
            return
        if worker.proc.poll() is not None:
            self._on_exit(worker)
            return
        if worker.state == "ready" and is_due(worker, self.heartbeat_limits):
            await self._heartbeat(worker)

    async def _heartbeat(self, worker: WorkerProcess) -> None:
        why, failing = await liveness(worker, self.heartbeat_limits)
        if worker.proc is None or worker.proc.poll() is not None:
            return  # the process poll sees the exit
        if why:
            log.error("worker for %s %s; killing it", worker.spec.name, why)
            worker.last_error = why
            worker.kill()
        elif failing and worker.state == "ready":  # a restart would fail the same way
            worker.fail(failing)
            self._background(self._stop_failed(worker))

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
        why = crash_reason(worker, code, was_ready, self.restart_limits)
        if why:
            worker.fail(why)
            return
        worker.restarts += 1
        worker.recovering = True
        self._background(self._restart(worker, backoff_s(worker, self.restart_limits)))

    async def _stop_failed(self, worker: WorkerProcess) -> None:
        proc = worker.proc
        await worker.terminate()
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


def _preloads(worker: WorkerProcess) -> bool:
    """Spawned at start: pinned or preloaded, and not attached (``--worker``)."""
    return (worker.spec.preload or worker.spec.pinned) and not worker.attached


def _replica(worker: WorkerProcess) -> Replica:
    """The router's view of a slot: ready or not, and its epoch (when it became ready)."""
    return Replica(
        worker.client,
        is_ready=lambda: worker.state == "ready",
        epoch=lambda: worker.started_at,
        control=worker.control.sibling(),
    )


async def _note_warming(worker: WorkerProcess) -> None:
    """A loaded worker that does not serve yet may be warming up (worker/warmup.py): its
    control thread says so, and what it builds, while the engine thread is busy with it."""
    ping = Ping(request_id=worker.heartbeat.next_id())
    with contextlib.suppress(MlxdError):
        # short: its control thread answers at once once bound, and the data ping waits next
        pong = await worker.heartbeat.request(ping, timeout_s=0.25)
        if isinstance(pong, Pong) and pong.warming and worker.state in LOADING:
            if worker.state != "warming":
                log.info("worker for %s is warming up", worker.spec.name)
            worker.state, worker.progress = "warming", pong.warming


def _summary(info: WorkerInfo, group: list[WorkerProcess], replica_set: ReplicaSet) -> WorkerInfo:
    """A replicated model as one row: ready while one replica is, in-flight and memory summed,
    and one ``ReplicaInfo`` per replica."""
    states = [w.state for w in group]
    state = next((s for s in ("ready", *LOADING, "stopping") if s in states), info.state)
    replicas = [
        ReplicaInfo(
            index=w.replica,
            state=w.state,
            endpoint=w.endpoint,
            pid=None if w.proc is None else w.proc.pid,
            restarts=w.restarts,
            in_flight=w.client.in_flight,
            routed=replica_set.routed[w.replica],
            num_waiting=r.num_waiting,
            num_running=r.num_running,
            last_error=w.last_error,
            gpus=w.gpus,
        )
        for w, r in zip(group, replica_set.replicas, strict=True)
    ]
    return dataclasses.replace(
        info,
        state=state,
        restarts=sum(w.restarts for w in group),
        gpus=",".join(dict.fromkeys(g for w in group for g in w.gpus.split(",") if g)),
        in_flight=sum(r.in_flight for r in replicas),
        memory_bytes=sum(w.size.total_bytes for w in group),
        replica_rows=replicas,
        last_error="" if state == "ready" else info.last_error,
    )
