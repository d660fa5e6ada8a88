"""The gateway's side of the data plane: one DEALER per worker, one queue per request.

A ``WorkerClient`` owns a DEALER socket connected to a worker's ROUTER and a reader task that
routes every incoming event to the ``RequestStream`` with its ``request_id``. The pools that map
model names to clients are in ``pool``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio

from mlxd.errors import (
    InternalError,
    MlxdError,
    ProtocolError,
    RequestTimeout,
    WorkerUnavailable,
    error_from_code,
)
from mlxd.protocol import curve
from mlxd.protocol.client_channel import ClientChannel
from mlxd.protocol.messages import (
    Cancel,
    CountTokens,
    Embed,
    Embeddings,
    Error,
    Event,
    Events,
    Finished,
    Generate,
    Message,
    Ping,
    Pong,
    TokenCount,
    TokenDelta,
)

log = logging.getLogger(__name__)

# What a request's queue holds: worker events, or the error that ``fail_all`` delivers.
_Item = TokenDelta | Finished | Error | MlxdError
# Called with each event as it is taken from the queue (timing metrics); must be cheap.
StreamObserver = Callable[[TokenDelta | Finished], None]
# Events waiting for a client that reads slower than the worker writes: past this many the
# request is cancelled, so a stalled reader costs bounded memory and frees its sequence.
MAX_BUFFERED_EVENTS = 1024
SEND_TIMEOUT_S = 30.0  # the longest a send to a worker may wait (``WorkerClient._send``)
# Retries a failed worker's stream on another replica; whether it did (``ReplicaSet._rescue``).
Rescue = Callable[["RequestStream", "WorkerClient"], bool]


class RequestStream:
    """The events of one request, as an async iterator.

    Yields ``TokenDelta`` values and finally one ``Finished``; an ``Error`` from the worker (or
    ``WorkerClient.fail_all``) is raised as the matching ``MlxdError``. Waiting on it can be
    cancelled (e.g. by ``asyncio.timeout``) without losing events.
    """

    def __init__(
        self,
        client: WorkerClient,
        request_id: str,
        observer: StreamObserver | None = None,
        max_buffered: int = MAX_BUFFERED_EVENTS,
    ) -> None:
        self.request_id = request_id
        self._client = client
        self._observer = observer
        self._max_buffered = max_buffered
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._is_done = False
        self._cancelled = False  # the worker was told to stop (cancel, or a client too slow)
        self.gen: Generate | None = None  # what was sent: another replica may take it over
        self.num_received = 0  # events from the worker; none yet: it may go to another replica

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        if self._is_done:
            raise StopAsyncIteration
        return self._take(await self._queue.get())

    def next_ready(self) -> TokenDelta | Finished | None:
        """The next event if one is already waiting, else ``None`` (never waits)."""
        if self._is_done or self._queue.empty():
            return None
        return self._take(self._queue.get_nowait())

    def _take(self, item: _Item) -> TokenDelta | Finished:
        if self._observer is not None and isinstance(item, TokenDelta | Finished):
            self._observer(item)
        if isinstance(item, TokenDelta):
            return item
        self._is_done = True
        self._client._unregister(self.request_id)
        if isinstance(item, Finished):
            return item
        if isinstance(item, Error):
            raise error_from_code(item.code, item.message, item.param, item.retry_after_s)
        raise item

    @property
    def is_done(self) -> bool:
        """True once the request finished, failed or was cancelled."""
        return self._is_done

    async def cancel(self) -> None:
        """Tell the worker to stop this request. Idempotent; a no-op once the request is done."""
        if self._is_done:
            return
        self._is_done = True
        self._client._unregister(self.request_id)
        if not self._cancelled:
            self._cancelled = True
            await self._client._send(Cancel(request_id=self.request_id))

    def _put(self, item: _Item) -> None:
        self.num_received += not isinstance(item, MlxdError)
        if self._queue.qsize() >= self._max_buffered and not isinstance(item, MlxdError):
            # The client reads slower than the worker writes: the stream ends (after what it
            # holds) and the worker stops the request, so a stalled reader costs bounded memory.
            self._client._unregister(self.request_id)
            self._client._cancel_soon(self.request_id)
            self._cancelled = True
            item = RequestTimeout(
                f"the client read too slowly: over {self._max_buffered} events waited"
            )
        self._queue.put_nowait(item)


class WorkerClient:
    """A connection to one worker process (a DEALER socket) and its in-flight requests.

    Args:
        name: the model name this worker serves (for logs and errors).
        endpoint: the worker's ROUTER endpoint, e.g. ``ipc:///tmp/mlxd/model.sock``.
        context: a shared asyncio ZMQ context; when omitted the client owns (and terms) one.
        keys: CURVE keys, required for ``tcp://`` (``ConfigError`` without them).
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
        # ConfigError here for tcp:// without keys. Unbounded: never drop frames silently,
        # backpressure is the worker scheduler's queue limit.
        self._channel = ClientChannel(name, endpoint, keys, unbounded=True)
        self._owns_context = context is None
        self._context = context
        self._reader: asyncio.Task[None] | None = None
        self._streams: dict[str, RequestStream] = {}
        self._pings: dict[str, asyncio.Future[Pong]] = {}
        # Requests answered with one reply message (Embed, CountTokens): request_id -> future.
        self._replies: dict[str, asyncio.Future[Any]] = {}
        self._ping_ids = itertools.count()
        self._background: set[asyncio.Future[None]] = set()
        self._described: Pong | None = None
        # Set by a ReplicaSet: offered each failed stream that received nothing yet; True means
        # another replica took it over (gateway/backends/local/replicas.py).
        self.rescue: Rescue | None = None

    @property
    def in_flight(self) -> int:
        """How many requests are waiting on this worker (streams and one-reply calls)."""
        return len(self._streams) + len(self._replies)

    async def start(self) -> None:
        """Connect the DEALER socket and start routing incoming events."""
        if self._context is None:
            self._context = zmq.asyncio.Context()
        self._channel.open(self._context)
        self._reader = asyncio.create_task(self._read_loop(), name=f"mlxd-reader-{self.name}")

    async def close(self) -> None:
        """Fail what is in flight, stop the reader and close the socket (and owned context)."""
        self.fail_all(WorkerUnavailable(f"the gateway closed its connection to {self.name!r}"))
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        self._channel.close()
        if self._owns_context and self._context is not None:
            self._context.term()
            self._context = None

    async def ping(self, timeout_s: float) -> Pong:
        """Round-trip a Ping; raise ``WorkerUnavailable`` if no Pong comes within ``timeout_s``."""
        request_id = f"ping-{next(self._ping_ids)}"
        future: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._pings[request_id] = future
        try:
            async with asyncio.timeout(timeout_s):  # the send too: see ``_send``
                await self._send(Ping(request_id=request_id))
                return await future
        except TimeoutError:
            raise WorkerUnavailable(
                f"worker {self.name!r} did not answer a ping within {timeout_s:g}s"
            ) from None
        finally:
            self._pings.pop(request_id, None)

    async def describe(self, timeout_s: float) -> Pong:
        """What the worker serves (model, context, tool parser): one ping, then cached."""
        if self._described is None:
            self._described = await self.ping(timeout_s)
        return self._described

    async def open_stream(
        self, gen: Generate, observer: StreamObserver | None = None
    ) -> RequestStream:
        """Register a queue for ``gen.request_id``, then send the Generate.

        ``observer`` sees each event of the stream as it is read (the gateway's metrics).

        Raises:
            WorkerUnavailable: the client is not started or the send failed.
            InternalError: the request id is already in flight (the gateway makes ids unique).
        """
        if gen.request_id in self._streams:
            raise InternalError(f"request id {gen.request_id!r} is already in flight")
        stream = RequestStream(self, gen.request_id, observer)
        stream.gen = gen
        self._streams[gen.request_id] = stream
        try:
            await self._send(gen)
        except MlxdError:
            self._unregister(gen.request_id)
            raise
        return stream

    async def embed(self, msg: Embed, timeout_s: float) -> Embeddings:
        """Send ``msg`` and wait for its one ``Embeddings`` answer (see ``_call``)."""
        reply: Embeddings = await self._call(msg, timeout_s)
        return reply

    async def count_tokens(self, msg: CountTokens, timeout_s: float) -> TokenCount:
        """Send ``msg`` and wait for its one ``TokenCount`` answer (see ``_call``)."""
        reply: TokenCount = await self._call(msg, timeout_s)
        return reply

    def cut(self, error: MlxdError) -> None:
        """End every in-flight stream and one-reply call with ``error``, none rescued and no ping
        failed: the daemon stops and these ran past its drain timeout (``Supervisor.cut``)."""
        self._end_streams(error, rescue=None)
        _fail(self._replies.values(), error)

    def fail_all(self, error: MlxdError) -> None:
        """End every in-flight stream with ``error`` (the worker died or is going away).

        Call it from the event loop thread; pending pings fail the same way.
        """
        ended = self._end_streams(error, rescue=self.rescue)
        _fail([*self._pings.values(), *self._replies.values()], error)
        if ended:
            log.warning("failed %d request(s) on %r: %s", ended, self.name, error.message)

    def _end_streams(self, error: MlxdError, rescue: Rescue | None) -> int:
        """End every in-flight stream with ``error``, but those ``rescue`` retries on another
        replica (nothing of them was lost); how many ended."""
        streams, self._streams = self._streams, {}
        ended = 0
        for stream in streams.values():
            if rescue is not None and stream.num_received == 0 and rescue(stream, self):
                continue
            stream._put(error)
            ended += 1
        return ended

    def adopt(self, stream: RequestStream) -> None:
        """Take over ``stream`` from a failed replica: register it and send its ``Generate``
        again (from synchronous code: the send runs as a task; if it fails, the stream ends
        with ``WorkerUnavailable``)."""
        assert stream.gen is not None
        gen = stream.gen
        stream._client = self
        self._streams[gen.request_id] = stream

        async def send() -> None:
            try:
                await self._send(gen)
            except MlxdError as exc:
                self._unregister(gen.request_id)
                stream._put(exc)

        task = asyncio.ensure_future(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Internal helpers

    async def _call(self, msg: Embed | CountTokens, timeout_s: float) -> Any:
        """Send ``msg`` and wait for its one reply.

        Raises:
            MlxdError: the worker's ``Error`` (e.g. ``InvalidRequest`` naming an input).
            RequestTimeout: no answer within ``timeout_s`` (the worker is told to cancel).
            WorkerUnavailable: the send failed or the worker died (``fail_all``).
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[msg.request_id] = future
        try:
            async with asyncio.timeout(timeout_s):  # the send too: see ``_send``
                await self._send(msg)
                return await future
        except TimeoutError:
            self._cancel_soon(msg.request_id)  # a send that cannot complete must not delay this
            raise RequestTimeout("The request did not finish in time") from None
        finally:
            self._replies.pop(msg.request_id, None)

    def _unregister(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def _cancel_soon(self, request_id: str) -> None:
        """Send a Cancel from synchronous code (routing an event); failures are only logged:
        a worker that cannot be reached has no request to stop."""

        async def send() -> None:
            try:
                await self._send(Cancel(request_id=request_id))
            except MlxdError as exc:
                log.debug("cancel of %r not sent: %s", request_id, exc.message)

        task = asyncio.ensure_future(send())
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    async def _send(self, msg: Message) -> None:
        """Send ``msg``; ``WorkerUnavailable`` if the socket fails or the send cannot complete
        within ``SEND_TIMEOUT_S``. The DEALER's queue is unbounded, so a send waits only while
        the socket has no pipe to the worker: after a refused CURVE handshake libzmq drops the
        pipe until it reconnects, and a ping sent then waited for ever (a CI run hung in
        ``test_wrong_keys_and_plain_clients_are_refused``)."""
        if not self._channel.is_open:
            raise WorkerUnavailable(f"worker {self.name!r} is not connected")
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self._channel.send(msg)
        except zmq.ZMQError as exc:
            raise WorkerUnavailable(f"cannot send to worker {self.name!r}: {exc}") from None
        except TimeoutError:
            raise WorkerUnavailable(
                f"cannot reach worker {self.name!r}: a send waited {SEND_TIMEOUT_S:g}s"
            ) from None

    async def _read_loop(self) -> None:
        while True:
            try:
                msg = await self._channel.recv()
            except ProtocolError as exc:
                log.warning("dropped a bad frame set from worker %r: %s", self.name, exc.message)
                continue
            except zmq.ZMQError as exc:
                log.error("reader for worker %r stopped: %s", self.name, exc)
                self.fail_all(WorkerUnavailable(f"lost the connection to worker {self.name!r}"))
                return
            self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Events):
            for event in msg.events:
                self._route(event)
        elif isinstance(msg, TokenDelta | Finished | Error):
            self._route(msg)
        elif isinstance(msg, Pong):
            future = self._pings.get(msg.request_id)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, Embeddings | TokenCount):
            waiter = self._replies.get(msg.request_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg)
        else:
            log.warning("dropped an unexpected %s from worker %r", type(msg).__name__, self.name)

    def _route(self, event: Event) -> None:
        stream = self._streams.get(event.request_id)
        waiter = self._replies.get(event.request_id)
        if stream is None and isinstance(event, Error) and waiter is not None:
            if not waiter.done():
                error = error_from_code(event.code, event.message, event.param, event.retry_after_s)
                waiter.set_exception(error)
            return
        if stream is None:
            log.debug("dropped %s for unknown request %r", type(event).__name__, event.request_id)
            return
        stream._put(event)


def _fail(futures: Iterable[asyncio.Future[Any]], error: MlxdError) -> None:
    """Fail each of ``futures`` not yet done with ``error``."""
    for future in futures:
        if not future.done():
            future.set_exception(error)
