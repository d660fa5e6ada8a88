"""ClientChannel, the DEALER both gateway clients of a worker use, against a real ROUTER socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from mlxd.errors import ConfigError, ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.client_channel import ClientChannel
from mlxd.protocol.messages import Ping, Pong


def test_round_trip_bad_frames_and_reopen(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/w.sock"

    async def main() -> None:
        context = zmq.asyncio.Context()
        router = context.socket(zmq.ROUTER)
        router.bind(endpoint)
        channel = ClientChannel("m", endpoint, None)
        try:
            channel.open(context)
            await channel.send(Ping(request_id="p1"))
            client, *frames = await router.recv_multipart()
            assert codec.decode(frames) == Ping(request_id="p1")
            await router.send_multipart([client, b"junk"])  # a bad frame set: the socket lives on
            with pytest.raises(ProtocolError):
                await channel.recv()
            await router.send_multipart(
                [client, *codec.encode(Pong(request_id="p1", model="m", max_context=8))]
            )
            assert await asyncio.wait_for(channel.recv(), 5) == Pong(
                request_id="p1", model="m", max_context=8
            )
            channel.close()
            assert not channel.is_open
            with pytest.raises(zmq.ZMQError):
                await channel.send(Ping(request_id="p2"))
            channel.open(context)  # a fresh socket: a new identity at the ROUTER
            await channel.send(Ping(request_id="p3"))
            again, *_ = await router.recv_multipart()
            assert again != client
        finally:
            channel.close()
            router.close(linger=0)
            context.term()

    asyncio.run(main())


@pytest.mark.parametrize("unbounded, hwm", [(True, 0), (False, 1000)])
def test_data_socket_is_unbounded(tmp_path: Path, unbounded: bool, hwm: int) -> None:
    context = zmq.asyncio.Context()
    channel = ClientChannel("m", f"ipc://{tmp_path}/w.sock", None, unbounded=unbounded)
    channel.open(context)
    try:
        sock = channel._socket
        assert sock is not None
        assert (sock.getsockopt(zmq.SNDHWM), sock.getsockopt(zmq.RCVHWM)) == (hwm, hwm)
        assert sock.getsockopt(zmq.LINGER) == 0
    finally:
        channel.close()
        context.term()


def test_tcp_without_keys_is_refused() -> None:
    with pytest.raises(ConfigError):
        ClientChannel("m", "tcp://127.0.0.1:5555", None)
