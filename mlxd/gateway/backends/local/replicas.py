"""One model served by several workers (replicas): a client that picks one per request.

``ReplicaSet`` offers what the endpoints use of a ``WorkerClient`` (``ModelClient``). Each
``Generate`` goes to the replica the router picks (``prefix_router``: the one that served the
prompt's prefix, unless it is much busier; or round robin), so a conversation's turns keep
hitting the replica whose prefix cache holds the conversation. A replica that is not ready
(starting, restarting, failed, unloaded) gets nothing. When a replica dies, its requests that
had received nothing yet are sent again to another ready replica (``WorkerClient.rescue``);
those that had streamed something end with the error, as on a lone worker.

Load, for the "much busier" test, is what the gateway has in flight at the replica (its
waiting plus running requests, known at once) or what the replica last reported to the
stats poll (``num_waiting + num_running``, ``WorkerMetrics``), whichever is larger: the poll
sees requests other gateways sent, the live count sees this second's burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from mlxd.errors import MlxdError, WorkerUnavailable
from mlxd.gateway.backends.local.control import ControlClient
from mlxd.gateway.backends.local.prefix_router import PrefixRouter, RoundRobin, prefix_keys
from mlxd.gateway.backends.local.workers import RequestStream, StreamObserver, WorkerClient
from mlxd.protocol.messages import (
    CountTokens,
    Embed,
    Embeddings,
    Generate,
    GetStatus,
    Pong,
    StatusReply,
    TokenCount,
)

POLL_S = 2.0  # as WorkerMetrics polls: a replica's reported load is at most this old


@dataclass(eq=False)
class Replica:
    """One worker of a model, as the router sees it.

    ``is_ready`` and ``epoch`` come from the pool (the supervisor's slot): a new epoch (the
    time it last became ready) means a fresh process whose prefix cache is empty.
    ``control`` (its own connection) asks for the load it reports: ``num_waiting`` and
    ``num_running``, 0 until polled.
    """

    client: WorkerClient
    is_ready: Callable[[], bool]
    epoch: Callable[[], float]
    control: ControlClient | None = None
    num_waiting: int = 0
    num_running: int = 0
    polled_epoch: float = -1.0  # the epoch those counts are from: a restart voids them

    @property
    def polled_load(self) -> int:
        if self.polled_epoch != self.epoch():
            return 0
        return self.num_waiting + self.num_running

    def load(self) -> int | None:
        """Requests at this replica; None when it cannot take one."""
        if not self.is_ready():
            return None
        return max(self.client.in_flight, self.polled_load)


class ReplicaSet:
    """The replicas of model ``name`` and the routing policy between them.

    Args:
        name: the model name (for errors).
        replicas: its workers, replica 0 first.
        routing: ``cache_aware`` or ``round_robin`` (``ServeConfig.routing``).
    """

    def __init__(self, name: str, replicas: list[Replica], routing: str = "cache_aware") -> None:
        self.name = name
        self.replicas = replicas
        n = len(replicas)
        self.router: PrefixRouter | RoundRobin = (
            RoundRobin(n) if routing == "round_robin" else PrefixRouter(n)
        )
        self.routed = [0] * n  # requests sent to each replica (rescues included)
        for replica in replicas:
            replica.client.rescue = self._rescue

    @property
    def in_flight(self) -> int:
        """Requests waiting on any replica."""
        return sum(r.client.in_flight for r in self.replicas)

    async def describe(self, timeout_s: float) -> Pong:
        """What the model serves (every replica serves the same): asked of a ready one."""
        return await self._any().describe(timeout_s)

    async def open_stream(
        self, gen: Generate, observer: StreamObserver | None = None
    ) -> RequestStream:
        """Send ``gen`` to the replica the router picks for its prompt."""
        loads = [r.load() for r in self.replicas]
        epochs = [r.epoch() for r in self.replicas]
        try:
            i = self.router.choose(prefix_keys(gen.prompt), loads, epochs)
        except ValueError:
            raise WorkerUnavailable(f"no replica of {self.name!r} is ready") from None
        self.routed[i] += 1
        return await self.replicas[i].client.open_stream(gen, observer)

    async def embed(self, msg: Embed, timeout_s: float) -> Embeddings:
        """Embeddings share no prefix: the least loaded replica computes them."""
        return await self._any().embed(msg, timeout_s)

    async def count_tokens(self, msg: CountTokens, timeout_s: float) -> TokenCount:
        """Any ready replica counts the same (same tokenizer and template)."""
        return await self._any().count_tokens(msg, timeout_s)

    async def poll(self, interval_s: float = POLL_S) -> None:
        """Ask each ready replica for its queue depth and running rows, every ``interval_s``,
        until cancelled (the supervisor runs it as a task)."""
        while True:
            await asyncio.gather(*(self._poll_one(r) for r in self.replicas if r.is_ready()))
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        """Close the poll connections."""
        for replica in self.replicas:
            if replica.control is not None:
                await replica.control.close()

    # Internal helpers

    @staticmethod
    async def _poll_one(replica: Replica) -> None:
        if replica.control is None:
            return
        try:
            reply = await replica.control.request(GetStatus(request_id=replica.control.next_id()))
        except MlxdError:
            return  # busy or restarting: the live in-flight count still holds
        if isinstance(reply, StatusReply):
            replica.num_waiting, replica.num_running = reply.num_waiting, reply.num_running
            replica.polled_epoch = replica.epoch()

    def _any(self, besides: WorkerClient | None = None) -> WorkerClient:
        """The least loaded ready replica's client (not ``besides``)."""
        loads = [
            (load, i)
            for i, r in enumerate(self.replicas)
            if r.client is not besides and (load := r.load()) is not None
        ]
        if not loads:
            raise WorkerUnavailable(f"no replica of {self.name!r} is ready")
        return self.replicas[min(loads)[1]].client

    def _rescue(self, stream: RequestStream, failed: WorkerClient) -> bool:
        """``failed`` died before ``stream`` received anything: hand it to another replica."""
        try:
            client = self._any(besides=failed)
        except WorkerUnavailable:
            return False
        i = [r.client for r in self.replicas].index(client)
        self.routed[i] += 1
        if isinstance(self.router, PrefixRouter) and stream.gen is not None:
            # its prefix is now cached there, not on the replica that died
            self.router.record(prefix_keys(stream.gen.prompt), i, self.replicas[i].epoch())
        client.adopt(stream)
        return True
