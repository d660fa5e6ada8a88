"""A lean HTTP/1.1 client for streamed responses, for the load generator only.

httpx spends about 60 us of CPU per SSE event (h11 in pure Python and four layers of async
iteration), 280 us per token at 8 streams: on a small machine the benchmark's client then takes
the CPU the server needs. Here the event loop hands received bytes to a protocol's
``data_received``, which undoes chunked encoding, splits SSE events and passes each ``data:``
payload on: no coroutine runs per event. Plain ``http://`` only, keep-alive connections; a body
ends by ``Transfer-Encoding: chunked``, ``Content-Length`` or the server closing (HTTP/1.0 style
servers such as ``mlx_lm.server``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

OnData = Callable[[bytes], None]  # one SSE ``data:`` payload (without the ``data:`` prefix)


class SSEPool:
    """Keep-alive connections to one ``http://host:port``: one per request in flight (the
    caller bounds those), reused once idle."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http":
            raise ValueError(f"only http:// URLs, not {base_url!r}")
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self._idle: list[_Connection] = []

    async def post(
        self, path: str, payload: dict[str, Any], headers: dict[str, str], on_data: OnData
    ) -> tuple[int, bytes]:
        """POST ``payload`` as JSON; stream the response's SSE ``data:`` payloads to ``on_data``.

        Returns the status and, unless the response was an event stream, its body.

        Raises:
            ConnectionError: the server closed the connection before the response ended.
            OSError: the connection could not be made.
        """
        body = json.dumps(payload).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n"
        )
        conn = await self._connection()
        try:
            status, raw = await conn.request(head.encode("latin-1") + body, on_data)
        except BaseException:
            conn.close()
            raise
        if conn.reusable:
            self._idle.append(conn)
        return status, raw

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn


class _Connection(asyncio.Protocol):
    """One connection; one request at a time. Parses the response as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._done: asyncio.Future[tuple[int, bytes]] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            return
        try:
            self._feed(data)
        except Exception as exc:  # noqa: BLE001 - a malformed response or event fails its request
            self._finish(error=ConnectionError(f"bad response: {exc!r}"[:200]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._done is not None and not self._done.done():
            if self._until_close and self._head_done:
                self._finish()  # the body ran to the close, as announced
            else:
                self._finish(error=ConnectionError("the server closed the connection"))

    # One request

    async def request(self, raw: bytes, on_data: OnData) -> tuple[int, bytes]:
        assert self.transport is not None
        self.reusable = False
        self._done = asyncio.get_running_loop().create_future()
        self._on_data, self._buf, self._sse = on_data, b"", b""
        self._head_done = self._chunked = self._until_close = self._event_stream = False
        self._status, self._length, self._chunk_left, self._keep_alive = 0, 0, 0, True
        self._crlf = self._last = False
        self._body: list[bytes] = []
        self.transport.write(raw)
        return await self._done

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # Parsing

    def _feed(self, data: bytes) -> None:
        self._buf += data
        if not self._head_done:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(self._buf[:end].decode("latin-1"))
            self._buf = self._buf[end + 4 :]
        if self._chunked:
            self._chunks()
        elif self._until_close:
            self._content(self._buf)
            self._buf = b""
        else:
            take = self._buf[: self._length]
            self._buf, self._length = self._buf[len(take) :], self._length - len(take)
            self._content(take)
            if self._length == 0:
                self._finish()

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        version, code = status_line.split(" ", 2)[:2]
        self._status = int(code)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        self._head_done = True
        self._keep_alive = version == "HTTP/1.1" and headers.get("connection") != "close"
        self._event_stream = headers.get("content-type", "").startswith("text/event-stream")
        if "chunked" in headers.get("transfer-encoding", ""):
            self._chunked = True
        elif "content-length" in headers:
            self._length = int(headers["content-length"])
            if self._length == 0:
                self._finish()
        else:
            self._until_close, self._keep_alive = True, False

    def _chunks(self) -> None:
        """Undo chunked encoding: ``SIZE\r\n DATA \r\n`` ... ``0\r\n\r\n``."""
        while self._done is not None and not self._done.done():
            if self._chunk_left:  # inside a chunk's data
                take = self._buf[: self._chunk_left]
                if not take:
                    return
                self._buf, self._chunk_left = self._buf[len(take) :], self._chunk_left - len(take)
                self._content(take)
                if self._chunk_left:
                    return
                self._crlf = True
            if self._crlf:  # after a chunk's data
                if len(self._buf) < 2:
                    return
                self._buf, self._crlf = self._buf[2:], False
            if self._last:  # after the last chunk: no trailers, or trailers and a blank line
                if self._buf.startswith(b"\r\n") or b"\r\n\r\n" in self._buf:
                    self._buf = b""
                    self._finish()
                return
            end = self._buf.find(b"\r\n")
            if end < 0:
                return
            size = int(self._buf[:end].split(b";")[0], 16)
            self._buf = self._buf[end + 2 :]
            self._chunk_left, self._last = size, size == 0

    def _content(self, data: bytes) -> None:
        if not self._event_stream:
            self._body.append(data)
            return
        self._sse += data
        if b"\r" in self._sse:
            self._sse = self._sse.replace(b"\r\n", b"\n")
        *events, self._sse = self._sse.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._on_data(line[6:] if line[5:6] == b" " else line[5:])

    def _finish(self, error: Exception | None = None) -> None:
        if self._done is None or self._done.done():
            return
        if error is not None:
            self._done.set_exception(error)
            return
        self.reusable = self._keep_alive and not self._buf
        self._done.set_result((self._status, b"".join(self._body)))
