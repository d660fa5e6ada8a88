"""Collecting a non-streamed answer (every choice's text, finish reason and logprobs) or a
stream's first event, while watching for the client to go away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.requests import Request

from mlxd.gateway.request import EventStream
from mlxd.gateway.surfaces.sse import next_event
from mlxd.gateway.tools.calls import ToolCall
from mlxd.gateway.tools.reasoning import ReasoningSplitter
from mlxd.protocol.messages import Finished, Thinking, TokenDelta, TokenLogprob

_T = TypeVar("_T")


@dataclass(slots=True)
class ChoiceResult:
    """One collected choice: its text, how it ended, its logprobs and parsed tool calls, and
    its thinking text once split out (``ParsedRequest.reasoning``)."""

    text: str = ""
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop: str | None = None  # the stop string that ended it, if one did
    reasoning: str = ""
    thinking: Thinking | None = None  # how the output marks thinking (the first delta's)
    reasoning_tokens: int = 0  # output tokens inside thinking (``ReasoningSplitter.tokens``)


async def collect_while_connected(
    request: Request, stream: EventStream, deadline: float
) -> list[ChoiceResult] | None:
    """Collect every choice of ``stream``; ``None`` if the client disconnected first."""
    return await _unless_disconnected(request, collect(stream, deadline))


async def first_while_connected(
    request: Request, stream: EventStream, deadline: float
) -> TokenDelta | Finished | None:
    """The first event of ``stream`` (the end of prefill); ``None`` if the client left first,
    so a client gone during a long prefill frees its sequence at once."""
    return await _unless_disconnected(request, next_event(stream, deadline))


async def collect(stream: EventStream, deadline: float) -> list[ChoiceResult]:
    """Every choice of ``stream``, in choice order, once all have finished."""
    results = [ChoiceResult() for _ in range(stream.num_choices)]
    parts: list[list[str]] = [[] for _ in range(stream.num_choices)]
    counters = [ReasoningSplitter() for _ in results]  # the thinking's tokens, per choice
    while True:
        event = await next_event(stream, deadline)
        assert event is not None  # no keepalive was asked for
        i = stream.index(event)
        parts[i].append(event.text)
        if isinstance(event, Finished):
            result = results[i]
            result.text, result.finish_reason, result.stop = (
                "".join(parts[i]),
                event.finish_reason,
                event.stop,
            )
            result.reasoning_tokens = counters[i].tokens
            if stream.is_done:
                return results
        else:
            _add_delta(results[i], event)
            counters[i].delta(event)


def _add_delta(result: ChoiceResult, delta: TokenDelta) -> None:
    """What a delta adds besides its text: the thinking markers (first delta), logprobs."""
    if delta.thinking is not None:
        result.thinking = delta.thinking
    if delta.logprobs is not None:
        if result.logprobs is None:
            result.logprobs = []
        result.logprobs.extend(delta.logprobs)


async def _unless_disconnected(request: Request, work: Awaitable[_T]) -> _T | None:
    """``work``'s result; ``None`` (and ``work`` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
