"""WorkerClient and RequestStream against a ScriptedWorker, without HTTP in between."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from scripted_worker import DEFAULT_REPLY, MODEL, ScriptedWorker

from mlxd.errors import ModelNotFound, Overloaded, RequestTimeout, WorkerUnavailable
from mlxd.gateway.backends.local import workers
from mlxd.gateway.backends.local.choices import Choices
from mlxd.gateway.backends.local.pool import StaticPool
from mlxd.gateway.backends.local.workers import RequestStream, WorkerClient
from mlxd.gateway.surfaces.openai.chunks import ChatChunks
from mlxd.gateway.surfaces.sse import DONE, KEEPALIVE, chunk_frames
from mlxd.protocol.messages import (
    ChatPrompt,
    CountTokens,
    Generate,
    SamplingParams,
    TokenDelta,
)


def generate(request_id: str, text: str = "hi", max_tokens: int | None = None) -> Generate:
    prompt = ChatPrompt(messages=[{"role": "user", "content": text}])
    return Generate(
        request_id=request_id, prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens)
    )


def with_client(endpoint: str, body: Callable[[WorkerClient], Awaitable[None]]) -> None:
    async def main() -> None:
        client = WorkerClient(MODEL, endpoint)
        await client.start()
        try:
            await body(client)
        finally:
            await client.close()

    asyncio.run(main())


async def read_text(stream: RequestStream) -> str:
    return "".join([event.text async for event in stream])


def test_ping(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        pong = await client.ping(timeout_s=2)
        assert (pong.model, pong.max_context) == (MODEL, 4096)

    with_client(worker.endpoint, body)


def test_ping_timeout_is_worker_unavailable(tmp_path: Path) -> None:
    async def body(client: WorkerClient) -> None:
        with pytest.raises(WorkerUnavailable):
            await client.ping(timeout_s=0.05)

    with_client(f"ipc://{tmp_path}/nobody.sock", body)


def test_a_send_that_cannot_complete_ends_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DEALER with no pipe to its worker waits in send: after a refused CURVE handshake until
    libzmq reconnects, and a ping sent then hung a CI run. Here the socket has no pipe because
    it only queues to completed connections (``IMMEDIATE``) and nobody binds its endpoint: a
    ping and a one-reply call end at their own timeouts, a stream's send at ``SEND_TIMEOUT_S``."""
    real = zmq.asyncio.Context.socket

    def no_pipe_until_connected(self: zmq.asyncio.Context, kind: int, **kw: object) -> object:
        sock = real(self, kind, **kw)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        return sock

    monkeypatch.setattr(zmq.asyncio.Context, "socket", no_pipe_until_connected)
    monkeypatch.setattr(workers, "SEND_TIMEOUT_S", 0.3)

    async def body(client: WorkerClient) -> None:
        t0 = time.monotonic()
        with pytest.raises(WorkerUnavailable, match="did not answer a ping"):
            await client.ping(timeout_s=0.2)
        count = CountTokens(request_id="c1", prompt=generate("c1").prompt)
        with pytest.raises(RequestTimeout):
            await client.count_tokens(count, timeout_s=0.2)
        with pytest.raises(WorkerUnavailable, match="a send waited"):
            await client.open_stream(generate("s1"))
        assert client.in_flight == 0 and time.monotonic() - t0 < 5

    with_client(f"ipc://{tmp_path}/nobody.sock", body)


def test_concurrent_streams_are_demuxed(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        streams = [await client.open_stream(generate(f"demux-{i}")) for i in range(4)]
        assert client.in_flight == 4
        texts = await asyncio.gather(*(read_text(s) for s in streams))
        assert texts == [DEFAULT_REPLY] * 4
        assert client.in_flight == 0

    with_client(worker.endpoint, body)


def test_cancel_is_sent_once(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        stream = await client.open_stream(generate("cancel-once", "SLOW"))
        await anext(stream)
        await stream.cancel()
        await stream.cancel()
        assert client.in_flight == 0
        assert [e async for e in stream] == []

    with_client(worker.endpoint, body)
    assert worker.wait_cancel("cancel-once") is not None
    assert worker.cancels.count("cancel-once") == 1


def test_cancel_after_finish_sends_nothing(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        stream = await client.open_stream(generate("after-finish"))
        assert await read_text(stream) == DEFAULT_REPLY
        await stream.cancel()

    with_client(worker.endpoint, body)
    assert worker.wait_cancel("after-finish", timeout_s=0.2) is None


def test_worker_error_is_raised(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        stream = await client.open_stream(generate("err", "ERROR:overloaded"))
        with pytest.raises(Overloaded):
            await anext(stream)
        assert client.in_flight == 0

    with_client(worker.endpoint, body)


def test_fail_all_ends_every_stream(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        streams = [await client.open_stream(generate(f"fail-{i}", "SILENT")) for i in range(3)]
        client.fail_all(WorkerUnavailable("the worker died"))
        assert client.in_flight == 0
        for stream in streams:
            with pytest.raises(WorkerUnavailable, match="died"):
                await anext(stream)

    with_client(worker.endpoint, body)


def test_sse_keepalive_then_timeout(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        stream = Choices([await client.open_stream(generate("keepalive", "SILENT"))])
        first = TokenDelta(request_id="keepalive", text="x", token_ids=[1])
        fmt = ChatChunks("chatcmpl-1", MODEL, 0)
        deadline = time.monotonic() + 0.25
        frames = [f async for f in chunk_frames(stream, first, fmt, deadline, keepalive_s=0.05)]
        assert frames.count(KEEPALIVE) >= 3
        assert b'"code":"timeout"' in frames[-2]
        assert frames[-1] == DONE

    with_client(worker.endpoint, body)
    assert worker.wait_cancel("keepalive") is not None


def test_sse_sends_the_events_already_waiting_in_one_write(worker: ScriptedWorker) -> None:
    async def body(client: WorkerClient) -> None:
        stream = Choices([await client.open_stream(generate("burst"))])
        first = await anext(stream)
        await asyncio.sleep(0.3)  # the rest of the reply (and Finished) arrives meanwhile
        fmt = ChatChunks("chatcmpl-1", MODEL, 0)
        frames = [f async for f in chunk_frames(stream, first, fmt, time.monotonic() + 10)]
        role, burst, done = frames  # the role chunk, everything else at once, [DONE]
        assert b'"role":"assistant"' in role and done == DONE
        words = DEFAULT_REPLY.split()
        assert burst.count(b"data: ") == len(words) + 1  # each word's chunk, then finish_reason
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            for line in burst.decode().split("\n\n")
            if line
        )
        assert text == DEFAULT_REPLY

    with_client(worker.endpoint, body)


def test_static_pool_unknown_model(worker: ScriptedWorker) -> None:
    async def main() -> None:
        pool = StaticPool({MODEL: worker.endpoint})
        await pool.start()
        try:
            assert (await pool.client(MODEL)).name == MODEL
            with pytest.raises(ModelNotFound):
                await pool.client("other")
        finally:
            await pool.stop()

    asyncio.run(main())
