"""The worker's control plane: admin commands on the control socket, answered between steps.

Pings never get here: the control socket's relay thread answers them at once (see
``protocol/control_relay.py``). ``Control.poll`` runs on the engine thread (``Engine.run`` calls
it every iteration), so the handlers may read and change the engine, the scheduler and MLX state
without locks. Every request gets exactly one reply: the answer, an ``Ack``, or a typed
``Error``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxd.config import SchedulerConfig
from mlxd.errors import ConfigError, InvalidRequest, MlxdError, ProtocolError
from mlxd.knobs import LIVE_KNOBS
from mlxd.protocol.messages import (
    Ack,
    ComputeInfo,
    ControlReply,
    DebugCrash,
    DebugFailSteps,
    DebugSleep,
    Drain,
    Error,
    FlushCache,
    GetStats,
    GetStatus,
    MemoryUsage,
    Message,
    Pause,
    Ping,
    Pong,
    Resume,
    SchedulerSettings,
    SetConfig,
    Shutdown,
    StatusReply,
)

if TYPE_CHECKING:
    from mlxd.worker.engine import Engine

log = logging.getLogger(__name__)

SETTABLE = tuple(k.field for k in LIVE_KNOBS)  # SetConfig's fields


class Control:
    """Handlers for the control messages of one engine.

    Args:
        engine: the engine to report on and steer (its channel has a control socket bound).
        model_path: what the worker loaded, for ``status``.
        compute: how it computes (``cpu_backend.prepare``), for ``status``.
        enable_test_faults: accept ``DebugCrash``, ``DebugSleep`` and ``DebugFailSteps`` (fault
            tests only); refused otherwise.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        model_path: str,
        enable_test_faults: bool = False,
        cache_limit_bytes: int | None = None,
        compute: ComputeInfo | None = None,
    ) -> None:
        self.engine = engine
        self.compute = compute
        self.model_path = model_path
        self.cache_limit_bytes = cache_limit_bytes
        self.weights_bytes = _weights_bytes(engine.runner.model)
        self._handlers: dict[type, Callable[[Any], ControlReply]] = {
            Ping: self._ping,
            GetStatus: self._status,
            GetStats: self._stats,
            Drain: self._drain,
            Pause: self._pause,
            Resume: self._resume,
            FlushCache: self._flush_cache,
            SetConfig: self._set,
            Shutdown: self._shutdown,
        }
        if enable_test_faults:
            self._handlers[DebugCrash] = self._crash
            self._handlers[DebugSleep] = self._sleep
            self._handlers[DebugFailSteps] = self._fail_steps

    # Public API

    def poll(self) -> None:
        """Answer every control message already waiting (never blocks)."""
        for client, msg in self.engine.channel.recv_control():
            self.dispatch(client, msg)

    def dispatch(self, client: bytes, msg: Message | ProtocolError) -> None:
        request_id = getattr(msg, "request_id", "")
        try:
            reply = self._handle(msg)
        except MlxdError as exc:
            log.warning("control %s %r failed: %s", type(msg).__name__, request_id, exc.message)
            reply = Error(
                request_id=request_id, code=exc.code, message=exc.message, param=exc.param
            )
        self.engine.channel.send_control(client, reply)

    @property
    def state(self) -> str:
        """The worker's state: draining (also while shutting down), paused or running."""
        if self.engine.draining:
            return "draining"
        return "paused" if self.engine.paused else "running"

    # Handlers

    def _handle(self, msg: Message | ProtocolError) -> ControlReply:
        if isinstance(msg, ProtocolError):
            raise msg
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"the control socket does not accept {type(msg).__name__} messages")
        return handler(msg)

    def _ping(self, msg: Ping) -> Pong:  # a channel bound without a ping answer sends them here
        return self.engine.pong(msg)

    def _status(self, msg: GetStatus) -> StatusReply:
        engine, sched = self.engine, self.engine.scheduler
        memory = MemoryUsage(
            weights_bytes=self.weights_bytes,
            kv_bytes=self._kv_bytes(),
            active_bytes=mx.get_active_memory(),
            peak_bytes=mx.get_peak_memory(),
            cache_bytes=mx.get_cache_memory(),
            cache_limit_bytes=self.cache_limit_bytes,
            kv_reserved_bytes=engine.runner.kv_reserved_bytes,
            kv_budget_bytes=engine.runner.kv_budget_bytes,
        )
        return StatusReply(
            request_id=msg.request_id,
            model=engine.name,
            model_path=self.model_path,
            state=self.state,
            pid=os.getpid(),
            uptime_s=engine.stats.uptime_s(),
            max_context=engine.max_context,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_prefilling=len(sched.prefilling),
            memory=memory,
            scheduler=SchedulerSettings(**dataclasses.asdict(sched.config)),
            kv_cache=engine.runner.kv_description,
            compute=self.compute,
        )

    def _stats(self, msg: GetStats) -> ControlReply:
        engine = self.engine
        return engine.stats.reply(
            msg.request_id, engine.scheduler.kv_report(), engine.runner.gathered_steps
        )

    def _drain(self, msg: Drain) -> Ack:
        self.engine.draining, self.engine.paused = True, False  # draining needs steps
        log.info("draining: %d request(s) left", self._num_in_flight())
        return self._ack(msg.request_id, f"{self._num_in_flight()} request(s) left")

    def _pause(self, msg: Pause) -> Ack:
        if self.engine.draining:
            raise InvalidRequest("the worker is draining; it cannot be paused")
        self.engine.paused = True
        return self._ack(msg.request_id)

    def _resume(self, msg: Resume) -> Ack:
        if self.engine.exit_when_drained:
            raise InvalidRequest("the worker is shutting down; it cannot be resumed")
        self.engine.paused = self.engine.draining = False
        return self._ack(msg.request_id)

    def _flush_cache(self, msg: FlushCache) -> Ack:
        blocks = self.engine.scheduler.flush_prefix_cache()
        snapshots = self.engine.runner.flush_prefix_cache()
        freed = mx.get_cache_memory()
        mx.clear_cache()
        return self._ack(
            msg.request_id,
            f"dropped {blocks} prefix-cache blocks and {snapshots} "
            f"snapshots, freed {freed} bytes of MLX buffer cache",
        )

    def _set(self, msg: SetConfig) -> Ack:
        changes = {k: getattr(msg, k) for k in SETTABLE if getattr(msg, k) is not None}
        if not changes:
            raise InvalidRequest(f"set needs at least one of {', '.join(SETTABLE)}")
        config = self.engine.scheduler.config
        for key, value in changes.items():  # one at a time, so the error names the field
            config = _replace(config, key, value)
        self.engine.scheduler.update_config(**changes)
        log.info("scheduler settings changed: %s", changes)
        return self._ack(msg.request_id, " ".join(f"{k}={v}" for k, v in changes.items()))

    def _shutdown(self, msg: Shutdown) -> Ack:
        self.engine.draining, self.engine.paused = True, False
        self.engine.exit_when_drained = True
        log.info("shutting down after %d request(s)", self._num_in_flight())
        return self._ack(msg.request_id, f"exiting after {self._num_in_flight()} request(s)")

    def _crash(self, msg: DebugCrash) -> ControlReply:
        log.critical("debug_crash %r: aborting (test faults are enabled)", msg.request_id)
        logging.shutdown()
        os.abort()

    def _sleep(self, msg: DebugSleep) -> ControlReply:
        log.warning(
            "debug_sleep %r: blocking the engine thread for %g s", msg.request_id, msg.seconds
        )
        time.sleep(msg.seconds)
        return self._ack(msg.request_id)

    def _fail_steps(self, msg: DebugFailSteps) -> ControlReply:
        log.warning(
            "debug_fail_steps %r: every model forward now raises %r", msg.request_id, msg.message
        )
        self.engine.runner.model = _FailingModel(self.engine.runner.model, msg.message)
        return self._ack(msg.request_id)

    # Internal helpers

    def _ack(self, request_id: str, message: str = "") -> Ack:
        return Ack(request_id=request_id, state=self.state, message=message)

    def _kv_bytes(self) -> int:
        """KV held by requests in flight (paged: their blocks; the pool is in ``kv_cache``)."""
        sched, runner = self.engine.scheduler, self.engine.runner
        if sched.pool is None:
            return runner.kv_bytes
        return sched.num_live_blocks() * runner.pool.bytes_per_block  # type: ignore[attr-defined]

    def _num_in_flight(self) -> int:
        s = self.engine.scheduler
        return len(s.waiting) + len(s.prefilling) + len(s.running)


class _FailingModel:
    """The model, except that calling it raises as MLX does when a forward fails."""

    def __init__(self, model: Any, message: str) -> None:
        self.model, self.message = model, message

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self.message)


def _weights_bytes(model: Any) -> int:
    leaves: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(int(v.nbytes) for _, v in leaves)


def _replace(config: SchedulerConfig, key: str, value: float) -> SchedulerConfig:
    try:
        return dataclasses.replace(config, **{key: value})  # type: ignore[arg-type]
    except ConfigError as exc:
        raise InvalidRequest(f"bad value {key}={value}: {exc.message}", param=key) from None
