"""Collecting a non-streamed answer: every choice's text, finish reason and logprobs, while
watching for the client to go away."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from mlxd.gateway.choices import Choices
from mlxd.gateway.responses import ChoiceResult
from mlxd.gateway.streaming import next_event
from mlxd.protocol.messages import Finished


async def collect_while_connected(
    request: Request, stream: Choices, deadline: float
) -> list[ChoiceResult] | None:
    """Collect every choice of ``stream``; ``None`` if the client disconnected first."""
    collector = asyncio.ensure_future(collect(stream, deadline))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((collector, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        collector.cancel()
        watcher.cancel()
        await asyncio.gather(collector, watcher, return_exceptions=True)
    return None if collector.cancelled() else collector.result()


async def collect(stream: Choices, deadline: float) -> list[ChoiceResult]:
    """Every choice of ``stream``, in choice order, once all have finished."""
    results = [ChoiceResult() for _ in stream.streams]
    parts: list[list[str]] = [[] for _ in stream.streams]
    while True:
        event = await next_event(stream, deadline)
        assert event is not None  # no keepalive was asked for
        i = stream.index(event)
        parts[i].append(event.text)
        if isinstance(event, Finished):
            result = results[i]
            result.text, result.finish_reason, result.stop = (
                "".join(parts[i]), event.finish_reason, event.stop
            )  # fmt: skip
            if stream.is_done:
                return results
        elif event.logprobs is not None:
            if results[i].logprobs is None:
                results[i].logprobs = []
            results[i].logprobs.extend(event.logprobs)  # type: ignore[union-attr]


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
