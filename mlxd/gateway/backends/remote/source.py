"""Remote backends as event sources: a request of any API surface sent to a backend of another
API, and its answer read back as the internal event stream that the surface renders, exactly
as it renders a local worker's.

``EventSource.open`` builds the backend's request (``bodies``), sends it (``upstream``: slots,
breaker, timeouts, redaction) and hands back an ``Opened`` whose stream (``UpstreamEvents``)
reads the answer with the backend kind's reader (``readers``). A task pumps the upstream into
a bounded queue, so waiting for an event can be cancelled (keepalives, deadlines) without
breaking the upstream read, and a client that stops reading stops the upstream too. Until the
first event arrives a failure is still an error the pipeline fails over on; closing the stream
(the answer done, the client gone, an error) closes the upstream connection, which is how a
cloud API (or another mlxd) learns to stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import replace

import anyio
import httpx

from mlxd.errors import MlxdError, UpstreamError
from mlxd.gateway.backends.remote.bodies import upstream_request
from mlxd.gateway.backends.remote.metrics import BackendMetrics
from mlxd.gateway.backends.remote.readers import AnthropicReader, Event, OpenAIReader
from mlxd.gateway.backends.remote.relay import Done, finisher, read_sse, read_sse_data
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.request import ApiRequest, Opened, ParsedRequest
from mlxd.gateway.routing.router import Target
from mlxd.gateway.tools.formats import UPSTREAM_TOOLS
from mlxd.protocol.messages import ChatPrompt, Finished, TokenDelta, Usage

log = logging.getLogger(__name__)

MAX_WAITING_EVENTS = 256  # read ahead of the client; then the upstream waits (TCP backpressure)
_DONE_DATA = "[DONE]"
_Item = Event | BaseException
Observer = Callable[[TokenDelta | Finished], None]


class EventSource:
    """Opens requests on remote backends as internal event streams.

    Args:
        backends: backend name -> its client.
        metrics: the gateway's per-model metrics (in flight, time to first token, usage).
        backend_metrics: the per-backend counters.
    """

    def __init__(
        self,
        backends: Mapping[str, RemoteBackend],
        metrics: Metrics,
        backend_metrics: BackendMetrics,
    ) -> None:
        self.backends = backends
        self.metrics = metrics
        self.backend_metrics = backend_metrics

    async def open(self, request: ApiRequest, target: Target) -> Opened:
        """Send ``request`` to ``target``'s backend in the backend's API; its answer's events.

        Raises:
            MlxdError: the body is invalid or cannot be carried by the backend's API (400), or
                the backend failed before answering (what the pipeline fails over on).
        """
        backend = self.backends[target.backend]
        parsed: ParsedRequest = await request.for_model(target.name).ready()
        path, body = upstream_request(parsed, backend.spec.kind, target.upstream)
        record = request.record
        record.model, record.backend, record.stream = target.name, backend.name, parsed.stream
        deadline = time.monotonic() + request.timeout_s
        started = record.sent_at = time.perf_counter()
        try:
            response = await backend.send(path, body, record.request_id, parsed.priority)
        except MlxdError as exc:
            self.backend_metrics.done(backend.name, target.name, exc.code)
            raise
        done = finisher(self.backend_metrics, backend, target, response, started)
        events = _events(response, backend, record.request_id, parsed)
        stream = UpstreamEvents(
            record.request_id, parsed.n, events, done, self.metrics.track(record)
        )
        return Opened(_rendered(parsed), stream, deadline, record)


class UpstreamEvents:
    """The ``EventStream`` of one upstream answer (see ``request.EventStream``).

    Args:
        request_id: the request's id (choice ``i`` of several: ``<id>-<i>``).
        n: its number of choices.
        events: the events as the upstream's answer is read, a list per read.
        done: the upstream response's once-only finisher (metrics, health, closing it).
        observer: the request's metrics observer, shown each event as it is taken.
    """

    def __init__(
        self,
        request_id: str,
        n: int,
        events: AsyncGenerator[list[Event], None],
        done: Done,
        observer: Observer | None = None,
    ) -> None:
        self.request_id = request_id
        self._n = n
        self._index = {request_id: 0} if n == 1 else {f"{request_id}-{i}": i for i in range(n)}
        self._events = events
        self._done = done
        self._observer = observer
        self._finished: list[Finished] = []
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(MAX_WAITING_EVENTS)
        self._pump = asyncio.ensure_future(self._run())

    def __aiter__(self) -> UpstreamEvents:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        if self.is_done:
            raise StopAsyncIteration
        return self._take(await self._queue.get())

    def next_ready(self) -> TokenDelta | Finished | None:
        """The next event if one is already waiting, else ``None`` (never waits)."""
        if self.is_done or self._queue.empty():
            return None
        return self._take(self._queue.get_nowait())

    @property
    def num_choices(self) -> int:
        """How many choices the request has (``n``)."""
        return self._n

    @property
    def is_done(self) -> bool:
        """True once every choice has finished."""
        return len(self._finished) == self._n

    def index(self, event: TokenDelta | Finished) -> int:
        """The choice an event belongs to."""
        return self._index[event.request_id]

    @property
    def usage(self) -> Usage:
        """The usage of the choices finished so far: the first has the request's usage, the
        others their completions only."""
        if not self._finished:
            return Usage(prompt_tokens=0, completion_tokens=0)
        first = self._finished[0].usage
        completion = sum(f.usage.completion_tokens for f in self._finished)
        return replace(first, completion_tokens=completion)

    async def cancel(self) -> None:
        """Stop reading and close the upstream response. Idempotent."""
        if not self._pump.done():
            self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)

    def _take(self, item: _Item) -> TokenDelta | Finished:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Finished):
            self._finished.append(item)
            if self._observer is not None:  # the request's usage so far, as the local one's
                self._observer(replace(item, usage=self.usage))
        elif self._observer is not None:
            self._observer(item)
        return item

    async def _run(self) -> None:
        outcome = "ok"
        try:
            async for events in self._events:
                for event in events:
                    await self._queue.put(event)
        except MlxdError as exc:
            outcome = exc.code
            await self._queue.put(exc)
        except Exception:  # a reader's bug: the client gets an error, not a hang
            log.exception("request %s: the upstream answer could not be read", self.request_id)
            outcome = UpstreamError.code
            await self._queue.put(UpstreamError("the backend's answer could not be read"))
        except BaseException:  # cancelled: the client went away, or the answer was abandoned
            outcome = "client_closed"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._done(outcome)
                await self._events.aclose()


async def _events(
    response: httpx.Response, backend: RemoteBackend, request_id: str, parsed: ParsedRequest
) -> AsyncGenerator[list[Event], None]:
    """The events of ``response``, read by its backend kind's reader (streamed or whole);
    every failure as the ``MlxdError`` a client would see."""
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    name, redact, reasoning = backend.name, backend.redact, parsed.reasoning
    reader: AnthropicReader | OpenAIReader = (
        AnthropicReader(request_id, name, redact, reasoning)
        if backend.spec.kind == "anthropic"
        else OpenAIReader(request_id, parsed.n, name, redact, reasoning)
    )
    try:
        if not streamed:
            yield reader.whole(_json(await response.aread(), backend.name))
            return
        items = (
            _anthropic_events(response, reader)
            if isinstance(reader, AnthropicReader)
            else _openai_events(response, reader)
        )
        async for events in items:
            yield events
    except httpx.HTTPError as exc:
        raise backend.failure(exc) from None


async def _openai_events(
    response: httpx.Response, reader: OpenAIReader
) -> AsyncIterator[list[Event]]:
    async for data in read_sse_data(response):
        if data == _DONE_DATA:
            break
        yield reader.chunk(_json(data, reader.backend))
    yield reader.end()


async def _anthropic_events(
    response: httpx.Response, reader: AnthropicReader
) -> AsyncIterator[list[Event]]:
    async for name, data in read_sse(response):
        yield reader.event(name, _json(data, reader.backend))
        if reader.finished:
            return
    yield reader.end()


def _json(data: str | bytes, backend: str) -> object:
    try:
        return json.loads(data)
    except ValueError:
        raise UpstreamError(f"backend {backend!r} answered with bad JSON") from None


def _rendered(parsed: ParsedRequest) -> ParsedRequest:
    """``parsed`` as its surface renders a remote answer: tool calls come in the gateway's own
    format, and as many as the upstream made (it enforced ``tool_choice`` itself)."""
    return replace(
        parsed,
        parse_tools=isinstance(parsed.prompt, ChatPrompt),
        tool_format=UPSTREAM_TOOLS.name,
        forced_tool_call=False,
        max_tool_calls=None,
    )
