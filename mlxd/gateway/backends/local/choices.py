"""The ``n`` choices of one request: ``n`` worker streams read as one.

Each choice is its own ``Generate`` with the same prompt (the worker's prefix cache shares the
prompt's KV blocks between them) and seed ``seed + i``, so choices differ yet a seeded request is
reproducible. Events come out in arrival order, each mapped back to its choice by ``index``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from mlxd.errors import MlxdError, RequestTimeout
from mlxd.gateway.backends.local.pool import ModelClient
from mlxd.gateway.backends.local.workers import MAX_BUFFERED_EVENTS, RequestStream, StreamObserver
from mlxd.protocol.messages import Finished, Generate, TokenDelta, Usage

_SEED_SPAN = 2**64  # seeds wrap within the signed 64-bit range the API accepts
_Item = tuple[int, TokenDelta | Finished] | BaseException


class Choices:
    """Async iterator over the events of ``n`` streams; done once every choice finished.

    One choice (the usual request) is read straight from its stream; several are merged into
    one queue by a task per choice.

    Args:
        streams: one stream per choice, in choice order.
    """

    def __init__(self, streams: list[RequestStream]) -> None:
        self.streams = streams
        self.request_id = streams[0].request_id
        self._index = {s.request_id: i for i, s in enumerate(streams)}
        self._finished: list[Finished] = []
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._only = streams[0] if len(streams) == 1 else None
        self._pumps = (
            []
            if self._only
            else [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(streams)]
        )

    @classmethod
    async def open(
        cls, worker: ModelClient, generates: list[Generate], observer: StreamObserver | None
    ) -> Choices:
        """Send every ``Generate``; if one cannot be sent, cancel those already sent."""
        observers = _observers(observer, len(generates))
        streams: list[RequestStream] = []
        try:
            for gen, obs in zip(generates, observers, strict=True):
                streams.append(await worker.open_stream(gen, obs))
        except MlxdError:
            for stream in streams:
                await stream.cancel()
            raise
        return cls(streams)

    def __aiter__(self) -> Choices:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        if self.is_done:
            raise StopAsyncIteration
        if self._only is not None:
            return self._note(await anext(self._only))
        return self._take(await self._queue.get())

    def next_ready(self) -> TokenDelta | Finished | None:
        """The next event if one is already waiting, else ``None`` (never waits)."""
        if self.is_done:
            return None
        if self._only is not None:
            event = self._only.next_ready()
            return None if event is None else self._note(event)
        if self._queue.empty():
            return None
        return self._take(self._queue.get_nowait())

    @property
    def num_choices(self) -> int:
        """How many choices the request has (``n``)."""
        return len(self.streams)

    @property
    def is_done(self) -> bool:
        """True once every choice has finished."""
        return len(self._finished) == len(self.streams)

    def index(self, event: TokenDelta | Finished) -> int:
        """The choice an event belongs to."""
        return self._index[event.request_id]

    @property
    def usage(self) -> Usage:
        """The usage of the choices finished so far, counted as one request."""
        return combined_usage([f.usage for f in self._finished])

    async def cancel(self) -> None:
        """Stop every choice still running. Idempotent."""
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for stream in self.streams:
            await stream.cancel()

    def _take(self, item: _Item) -> TokenDelta | Finished:
        if isinstance(item, BaseException):
            raise item
        return self._note(item[1])

    def _note(self, event: TokenDelta | Finished) -> TokenDelta | Finished:
        if isinstance(event, Finished):
            self._finished.append(event)
        return event

    async def _pump(self, index: int, stream: RequestStream) -> None:
        try:
            async for event in stream:
                if self._queue.qsize() >= MAX_BUFFERED_EVENTS:
                    await stream.cancel()
                    raise RequestTimeout(
                        f"the client read too slowly: over {MAX_BUFFERED_EVENTS} events waited"
                    )
                self._queue.put_nowait((index, event))
        except MlxdError as exc:
            self._queue.put_nowait(exc)


def generates(base: Generate, n: int) -> list[Generate]:
    """``n`` copies of ``base``: ids ``<id>-<i>`` and seeds ``seed + i`` when ``n > 1``."""
    if n == 1:
        return [base]
    seed = base.sampling.seed
    return [
        replace(
            base,
            request_id=f"{base.request_id}-{i}",
            sampling=replace(base.sampling, seed=None if seed is None else _wrap(seed + i)),
        )
        for i in range(n)
    ]


def combined_usage(usages: list[Usage]) -> Usage:
    """One request's usage: the prompt counted once, completions summed, the prompt's cached
    tokens as the least any choice found (what was cached before the request)."""
    if not usages:
        return Usage(prompt_tokens=0, completion_tokens=0)
    return Usage(
        prompt_tokens=usages[0].prompt_tokens,
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=min(u.cached_tokens for u in usages),
    )


def _wrap(seed: int) -> int:
    return (seed + _SEED_SPAN // 2) % _SEED_SPAN - _SEED_SPAN // 2


def _observers(observer: StreamObserver | None, n: int) -> list[StreamObserver | None]:
    # Metrics see one request: each Finished carries the usage of every choice finished so far.
    if observer is None or n == 1:
        return [observer] * n
    seen: list[Usage] = []

    def observe(event: TokenDelta | Finished) -> None:
        if isinstance(event, Finished):
            seen.append(event.usage)
            event = replace(event, usage=combined_usage(seen))
        observer(event)

    return [observe] * n
