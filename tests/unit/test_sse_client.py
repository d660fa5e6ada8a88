"""The load generator's lean HTTP client against a raw TCP server that writes scripted responses
in pieces of every size: chunked, Content-Length and close-delimited bodies, CRLF events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from mlxd.bench.sse_client import SSEPool

EVENTS = [b'{"n": 1}', b'{"text": "a\\nb"}', b"[DONE]"]
SSE = b"".join(b"data: " + e + b"\n\n" for e in EVENTS)


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


RESPONSES: dict[str, bytes] = {
    "chunked": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\n\r\n" + chunked(SSE, 13),
    "length": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE,
    "crlf": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + chunked(SSE.replace(b"\n", b"\r\n"), 5),
}
CLOSE_DELIMITED = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + SSE
ERROR = b'{"error": {"message": "no"}}'
NOT_SSE = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n" % len(ERROR) + ERROR
)


async def serve(responses: list[bytes], piece: int, close: bool) -> tuple[asyncio.Server, int]:
    """Answer each request on a connection with the next response, ``piece`` bytes at a time."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while responses:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            raw = responses.pop(0)
            for i in range(0, len(raw), piece):
                writer.write(raw[i : i + piece])
                await writer.drain()
                await asyncio.sleep(0)
            if close:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def run(body: Callable[[], object]) -> object:
    return asyncio.run(body())  # type: ignore[arg-type]


@pytest.mark.parametrize("piece", [1, 7, 10_000])
@pytest.mark.parametrize("kind", sorted(RESPONSES))
def test_events_arrive_whole_however_the_bytes_are_split(kind: str, piece: int) -> None:
    async def body() -> None:
        # two requests on one keep-alive connection
        server, port = await serve([RESPONSES[kind], RESPONSES[kind]], piece, close=False)
        pool = SSEPool(f"http://127.0.0.1:{port}")
        for _ in range(2):
            got: list[bytes] = []
            assert await pool.post("/v1/x", {"a": 1}, {}, got.append) == (200, b"")
            assert got == EVENTS
        pool.close()
        server.close()

    run(body)


def test_a_body_that_ends_when_the_server_closes() -> None:
    async def body() -> None:
        server, port = await serve([CLOSE_DELIMITED], 3, close=True)
        got: list[bytes] = []
        pool = SSEPool(f"http://127.0.0.1:{port}")
        assert await pool.post("/", {}, {}, got.append) == (200, b"")
        assert got == EVENTS and not pool._idle  # not reused
        server.close()

    run(body)


def test_an_error_status_returns_its_body_and_a_cut_stream_raises() -> None:
    async def body() -> None:
        cut = RESPONSES["chunked"][:-20]
        server, port = await serve([NOT_SSE, cut], 64, close=False)
        pool = SSEPool(f"http://127.0.0.1:{port}")
        assert await pool.post("/", {}, {}, lambda d: None) == (429, ERROR)
        with pytest.raises(ConnectionError, match="closed"):
            await pool.post("/", {}, {}, lambda d: None)
        server.close()

    run(body)


def test_an_event_its_reader_cannot_take_fails_that_request_only() -> None:
    async def body() -> None:
        server, port = await serve([RESPONSES["chunked"], RESPONSES["length"]], 64, close=False)
        pool = SSEPool(f"http://127.0.0.1:{port}")

        def refuse(data: bytes) -> None:
            raise KeyError("usage")

        with pytest.raises(ConnectionError, match="bad response: KeyError"):
            await pool.post("/", {}, {}, refuse)
        got: list[bytes] = []  # the next request gets a fresh connection
        assert await pool.post("/", {}, {}, got.append) == (200, b"") and got == EVENTS
        server.close()

    run(body)
