"""The gateway's side of the control plane: request/reply with one worker's control socket.

Admin traffic is rare, so a ``ControlClient`` keeps one request in flight at a time (a lock) and
matches replies by ``request_id``. After a timeout it drops its socket, and with it any command
still queued for a worker that is down, so a restarted worker never sees a stale command.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from mlxd.errors import ProtocolError, WorkerUnavailable, error_from_code
from mlxd.protocol import curve
from mlxd.protocol.client_channel import ClientChannel
from mlxd.protocol.messages import ControlReply, ControlRequest, Error

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class WorkerInfo:
    """How a ``WorkerPool`` sees one worker process (``GET /admin/status``).

    ``state`` is the supervisor's: "unloaded", "starting", "warming" (loaded, building the
    first requests' kernels: ``progress`` says which), "ready", "stopping", "failed" or
    "stopped". ``memory_bytes`` is what it reserves against ``--max-memory`` (weights + KV +
    headroom); ``idle_s`` is None while it serves or is not loaded.
    """

    state: str
    name: str = ""  # the model's name (what an alias stands for)
    pid: int | None = None
    restarts: int = 0
    last_error: str = ""
    memory_bytes: int = 0
    weights_bytes: int = 0
    kv_bytes: int = 0
    pinned: bool = False
    keep_alive_s: float = 0.0
    aliases: list[str] = field(default_factory=list)
    in_flight: int = 0
    uptime_s: float | None = None
    idle_s: float | None = None
    gpus: str = ""  # the CUDA GPUs it was placed on (mlxd.gpus; "" where there is no choice)
    path: str = ""  # what it loads (a directory, repo id, GGUF file; "" for attached workers)
    progress: str = ""  # while warming: the warm-up stage (worker/warmup.py)
    # A vision-language model's share of ``memory_bytes``: its tower's weights (in
    # ``weights_bytes``) and the encoder's peak activations (in the headroom).
    vision_weights_bytes: int = 0
    encoder_peak_bytes: int = 0
    # One entry per replica when several workers serve the model (--replicas, several
    # --worker NAME=...): the fields above then sum or summarise them.
    replica_rows: list[ReplicaInfo] = field(default_factory=list)


@dataclass
class ReplicaInfo:
    """One replica of a model served by several workers (``WorkerInfo.replicas``)."""

    index: int
    state: str
    endpoint: str
    pid: int | None = None
    restarts: int = 0
    in_flight: int = 0
    routed: int = 0  # requests the gateway sent it since the daemon started
    num_waiting: int = 0  # as it last reported (polled every 2 s)
    num_running: int = 0
    last_error: str = ""
    gpus: str = ""


class ControlClient:
    """A DEALER connected to one worker's control ROUTER.

    Args:
        name: the model name (for errors).
        endpoint: the worker's control endpoint, e.g. ``ipc:///tmp/mlxd-x/w0.ctl.sock``.
        context: the asyncio ZMQ context; by default the process's shared one. Control traffic
            is light: one context's I/O thread serves every worker's control clients, where a
            context per client cost two threads and a handful of descriptors each.
    """

    def __init__(
        self,
        name: str,
        endpoint: str,
        context: zmq.asyncio.Context | None = None,
        keys: curve.CurveKeys | None = None,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self._channel = ClientChannel(name, endpoint, keys)  # ConfigError: tcp:// without keys
        self._context = context
        self._lock = asyncio.Lock()
        self._ids = itertools.count()

    def sibling(self) -> ControlClient:
        """Another client of the same worker, with its own connection (and lock)."""
        return ControlClient(self.name, self.endpoint, self._context, keys=self._channel.keys)

    def next_id(self) -> str:
        """A fresh request id for the next control message."""
        return f"ctl-{next(self._ids)}"

    async def request(
        self, msg: ControlRequest, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> ControlReply:
        """Send ``msg`` and return the worker's reply.

        Raises:
            WorkerUnavailable: no reply within ``timeout_s`` (worker down, busy or restarting).
            MlxdError: the worker answered with an ``Error`` (rebuilt from its code).
        """
        async with self._lock:
            if self._context is None:
                self._context = zmq.asyncio.Context.instance()
            self._channel.open(self._context)
            try:
                async with asyncio.timeout(timeout_s):
                    await self._channel.send(msg)
                    reply = await self._recv_reply(msg.request_id)
            except TimeoutError:
                # Drop the socket, and with it any command still queued for a worker that is down.
                self._channel.close()
                raise WorkerUnavailable(
                    f"the worker for {self.name!r} did not answer {msg.TAG!r} within {timeout_s:g}s"
                ) from None
        if isinstance(reply, Error):
            raise error_from_code(reply.code, reply.message, reply.param)
        return reply

    async def close(self) -> None:
        self._channel.close()

    # Internal helpers

    async def _recv_reply(self, request_id: str) -> ControlReply:
        while True:
            try:
                reply = await self._channel.recv()
            except ProtocolError as exc:
                log.warning("dropped a bad control reply from %r: %s", self.name, exc.message)
                continue
            if getattr(reply, "request_id", None) == request_id:
                return reply  # type: ignore[return-value]
            log.debug("dropped a late control reply from %r", self.name)
