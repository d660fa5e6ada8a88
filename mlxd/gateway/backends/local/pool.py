"""Model name -> client: the ``WorkerPool`` interface the rest of the gateway uses, and
``StaticPool``, a pool of workers that are already running.

The daemon's supervisor (mlxd/daemon/supervisor.py) is the other ``WorkerPool``: it spawns,
restarts and unloads its workers. ``ModelClient`` is what a pool hands out for one model: a
``WorkerClient``, or a ``ReplicaSet`` over several.
"""

from __future__ import annotations

import logging
from typing import Protocol

import zmq
import zmq.asyncio

from mlxd.errors import InvalidRequest, ModelNotFound, WorkerUnavailable
from mlxd.gateway.backends.local.control import ControlClient, WorkerInfo
from mlxd.gateway.backends.local.workers import RequestStream, StreamObserver, WorkerClient
from mlxd.protocol import curve
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import CountTokens, Embed, Embeddings, Generate, Pong, TokenCount

log = logging.getLogger(__name__)


class ModelClient(Protocol):
    """What the endpoints use of a model's workers: one ``WorkerClient``, or a ``ReplicaSet``
    (gateway/backends/local/replicas.py) that picks a replica per request."""

    name: str

    @property
    def in_flight(self) -> int: ...

    async def describe(self, timeout_s: float) -> Pong: ...

    async def open_stream(
        self, gen: Generate, observer: StreamObserver | None = None
    ) -> RequestStream: ...

    async def embed(self, msg: Embed, timeout_s: float) -> Embeddings: ...

    async def count_tokens(self, msg: CountTokens, timeout_s: float) -> TokenCount: ...


class WorkerPool(Protocol):
    """Model name -> ``WorkerClient``. The supervisor implements it for spawned workers."""

    def names(self) -> list[str]:
        """The model names served, in display order."""
        ...

    async def client(self, name: str) -> ModelClient:
        """The client for ``name``; raise ``ModelNotFound`` (param ``model``) if unknown."""
        ...

    async def start(self) -> None:
        """Connect to (or spawn) the workers; called from the app's lifespan."""
        ...

    async def stop(self) -> None:
        """Disconnect from (or stop) the workers; called from the app's lifespan."""
        ...

    def restarts(self, name: str) -> int:
        """How many times the worker for ``name`` was restarted (0 if never or not supervised)."""
        ...

    def control(self, name: str) -> ControlClient:
        """The control-plane client of ``name``'s worker; raise ``ModelNotFound`` if unknown."""
        ...

    def info(self, name: str) -> WorkerInfo:
        """How the pool sees ``name``'s worker: state, pid, restarts, last error, memory.

        ``name`` may be an alias; raise ``ModelNotFound`` if unknown."""
        ...

    def budget(self) -> dict[str, int | None]:
        """``max_memory_bytes`` (None: no budget) and ``reserved_bytes`` of loaded workers."""
        ...

    async def load(self, name: str, wait: bool = True) -> WorkerInfo:
        """Start ``name``'s worker if it is not running (``MemoryBudgetExceeded`` if it cannot
        fit); with ``wait``, return once it is ready."""
        ...

    async def unload(self, name: str, reason: str = "unloaded on request") -> WorkerInfo:
        """Drain and stop ``name``'s worker; a later request loads it again."""
        ...

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """How long ``name`` stays loaded once idle, as its latest request asked (Ollama's
        ``keep_alive``): ``seconds`` idle, 0: unload once its requests are done, negative:
        never unload, ``None``: the server's keep-alive. Pinned models stay loaded; the
        worker's unload resets it."""
        ...


class StaticPool:
    """A ``WorkerPool`` over workers that are already running (``--worker`` attach, tests).

    Args:
        endpoints: model name -> the worker's ROUTER endpoint.
        keys: CURVE keys for ``tcp://`` endpoints.
    """

    def __init__(self, endpoints: dict[str, str], keys: curve.CurveKeys | None = None) -> None:
        self.endpoints = dict(endpoints)
        self.keys = keys
        self._context: zmq.asyncio.Context | None = None
        self._clients: dict[str, WorkerClient] = {}
        self._controls = {
            n: ControlClient(n, control_endpoint(e), keys=keys) for n, e in endpoints.items()
        }
        self._ignored_keep_alive: set[str] = set()

    def names(self) -> list[str]:
        return list(self.endpoints)

    def restarts(self, name: str) -> int:
        return 0  # not our processes: nothing restarts them

    def control(self, name: str) -> ControlClient:
        if name not in self._controls:
            raise ModelNotFound(f"The model {name!r} does not exist", param="model")
        return self._controls[name]

    def info(self, name: str) -> WorkerInfo:
        self.control(name)  # unknown name -> ModelNotFound
        client = self._clients.get(name)
        state = "stopped" if client is None else "ready"
        return WorkerInfo(state=state, in_flight=0 if client is None else client.in_flight)

    def budget(self) -> dict[str, int | None]:
        return {"max_memory_bytes": None, "reserved_bytes": 0}

    async def load(self, name: str, wait: bool = True) -> WorkerInfo:
        self.control(name)
        raise InvalidRequest(
            f"the worker for {name!r} was attached, not started by mlxd: it "
            "cannot be loaded or unloaded here"
        )

    async def unload(self, name: str, reason: str = "unloaded on request") -> WorkerInfo:
        return await self.load(name)

    def keep_alive(self, name: str, seconds: float | None) -> None:
        if seconds is not None and name not in self._ignored_keep_alive:
            self._ignored_keep_alive.add(name)  # said once per model: it may come every request
            log.warning(
                "keep_alive %gs for %r ignored: its worker was attached, not started by mlxd, "
                "so mlxd never unloads it",
                seconds,
                name,
            )

    async def client(self, name: str) -> WorkerClient:
        if name not in self.endpoints:
            raise ModelNotFound(f"The model {name!r} does not exist", param="model")
        client = self._clients.get(name)
        if client is None:
            raise WorkerUnavailable(f"the worker for {name!r} is not connected")
        return client

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        for name, endpoint in self.endpoints.items():
            client = WorkerClient(name, endpoint, self._context, self.keys)
            await client.start()
            self._clients[name] = client

    async def stop(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        for control in self._controls.values():
            await control.close()
        if self._context is not None:
            self._context.term()
            self._context = None
