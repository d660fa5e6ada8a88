"""Server-sent events: ``data: {json}\\n\\n`` frames from a request's event stream, then ``[DONE]``.

The endpoint waits for the first event before it builds an ``EventStreamResponse``, so errors
that come early (prompt too long, queue full) still get a real HTTP status. Whatever ends the
response (done, error, timeout, client gone), the request is cancelled on the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from mlxd.errors import MlxdError, RequestTimeout
from mlxd.gateway.request import EventStream
from mlxd.protocol.messages import Finished, TokenDelta, TokenLogprob, Usage

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"
KEEPALIVE_S = 15.0
STALL_TIMEOUT_S = 30.0


class ChunkFormat(Protocol):
    """Turns events into the JSON chunks of one endpoint (see ``chunks.ChatChunks``)."""

    def head(self) -> list[dict[str, Any]]:
        """Chunks sent before any text (the chat ``role`` chunk of each choice)."""
        ...

    def delta(
        self, index: int, text: str, logprobs: list[TokenLogprob] | None = None
    ) -> list[dict[str, Any]]:
        """The chunks for new text of choice ``index`` (and its tokens' logprobs, if asked)."""
        ...

    def text_frame(self, index: int, text: str) -> bytes | None:
        """The SSE frame of ``delta(index, text)`` with no logprobs, or ``None`` when this format
        cannot make it directly (text held back for tool calls): then ``delta`` is used."""
        ...

    def token_delta(self, index: int, delta: TokenDelta) -> list[dict[str, Any]]:
        """The chunks for a worker delta of choice ``index`` that ``text_frame`` did not make
        (its logprobs; its thinking markers, token ids and text where thinking is split)."""
        ...

    def finish(self, index: int, finished: Finished) -> list[dict[str, Any]]:
        """The last chunks of choice ``index``: remaining text and its ``finish_reason``."""
        ...

    def tail(self, usage: Usage) -> list[dict[str, Any]]:
        """The chunks after every choice finished: usage, if asked for."""
        ...


def sse(data: Mapping[str, Any]) -> bytes:
    """One SSE ``data:`` event holding ``data`` as compact JSON."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + body.encode("utf-8") + b"\n\n"


async def next_event(
    stream: EventStream, deadline: float, keepalive_s: float = float("inf")
) -> TokenDelta | Finished | None:
    """The stream's next event, or ``None`` after ``keepalive_s`` of silence.

    Raises:
        RequestTimeout: ``deadline`` (a ``time.monotonic()`` value) passed first.
        MlxdError: the worker answered with an ``Error`` or died.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise RequestTimeout("The request did not finish in time")
    # Under load events are often waiting already: no timer for those. Otherwise asyncio's
    # timeout, not anyio's: a cancel scope per token was the gateway's largest per-token cost
    # (cProfile, 64 streams).
    ready = stream.next_ready()
    if ready is not None:
        return ready
    try:
        async with asyncio.timeout(min(remaining, keepalive_s)):
            return await anext(stream)
    except TimeoutError:
        if remaining <= keepalive_s:
            raise RequestTimeout("The request did not finish in time") from None
        return None


async def chunk_frames(
    stream: EventStream,
    first: TokenDelta | Finished,
    fmt: ChunkFormat,
    deadline: float,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncGenerator[bytes, None]:
    """SSE frames for ``stream``, starting from its already received ``first`` event.

    Events that are already waiting go out together, in one write: a gateway that falls behind
    catches up in fewer, larger sends instead of falling further behind.

    An error after the headers went out becomes a ``data: {"error": ...}`` event before
    ``[DONE]``. On any exit (including cancellation when the client disconnects) every choice
    still running is cancelled on the worker.
    """
    try:
        for chunk in fmt.head():
            yield sse(chunk)
        event: TokenDelta | Finished | None = first
        while True:
            frames = _frames(stream, fmt, event)
            error: MlxdError | None = None
            while not _ends(stream, event):
                try:
                    waiting = stream.next_ready()
                except MlxdError as exc:  # after the frames before it
                    error = exc
                    break
                if waiting is None:
                    break
                event = waiting
                frames += _frames(stream, fmt, event)
            if frames:
                yield b"".join(frames)
            if error is not None:
                raise error
            if _ends(stream, event):
                break
            event = await next_event(stream, deadline, keepalive_s)
        for chunk in fmt.tail(stream.usage):
            yield sse(chunk)
    except MlxdError as exc:
        log.warning("request %s failed mid-stream: %s", stream.request_id, exc.message)
        yield sse({"error": exc.to_dict()})
    finally:
        with anyio.CancelScope(shield=True):
            await stream.cancel()
    yield DONE


def _ends(stream: EventStream, event: TokenDelta | Finished | None) -> bool:
    return isinstance(event, Finished) and stream.is_done


def _frames(
    stream: EventStream, fmt: ChunkFormat, event: TokenDelta | Finished | None
) -> list[bytes]:
    if event is None:
        return [KEEPALIVE]
    if isinstance(event, Finished):
        return [sse(c) for c in fmt.finish(stream.index(event), event)]
    if event.logprobs is None and event.text:
        frame = fmt.text_frame(stream.index(event), event.text)
        if frame is not None:
            return [frame]
    return [sse(c) for c in fmt.token_delta(stream.index(event), event)]


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response over ``events`` that always releases its request.

    Args:
        stream: the request's choices, cancelled whatever ends the response.
        events: the SSE frames (``chunk_frames``, or the Anthropic surface's).
        headers: extra response headers (``X-Request-Id``).
        stall_timeout_s: a send blocked this long (the client reads nothing) cuts the stream.
        media_type: another stream's type (``application/x-ndjson`` for Ollama's lines).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        stream: EventStream,
        events: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        media_type: str | None = None,
    ) -> None:
        if media_type is not None:
            self.media_type = media_type
        self._events = events
        self._stream = stream
        self._stall_timeout_s = stall_timeout_s
        sse_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        super().__init__(self._events, headers=sse_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A send blocks while the socket's buffers are full: the client stopped reading. One
        # watchdog per stream checks for that (a timeout around every send costs ~25 us each).
        blocked_since: list[float | None] = [None]

        async def timed_send(message: Message) -> None:
            blocked_since[0] = time.monotonic()
            await send(message)
            blocked_since[0] = None

        try:
            with anyio.CancelScope() as cut:
                watchdog = asyncio.ensure_future(self._watch(blocked_since, cut))
                try:
                    await super().__call__(scope, receive, timed_send)
                except ClientDisconnect:  # ASGI >= 2.4 servers report a gone client this way
                    log.info("client of request %s disconnected", self._stream.request_id)
                finally:
                    watchdog.cancel()
            if cut.cancelled_caught:
                # Returning with the body unfinished makes the server close the connection.
                log.warning(
                    "client of request %s read nothing for %gs; stream cut",
                    self._stream.request_id,
                    self._stall_timeout_s,
                )
        finally:
            # The generator may never have started (client gone before the first chunk).
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                await self._stream.cancel()

    async def _watch(self, blocked_since: list[float | None], cut: anyio.CancelScope) -> None:
        while True:
            await asyncio.sleep(self._stall_timeout_s / 4)
            since = blocked_since[0]
            if since is not None and time.monotonic() - since > self._stall_timeout_s:
                cut.cancel()
                return
