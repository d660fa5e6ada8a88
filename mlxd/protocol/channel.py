"""The worker's side of the data plane: a ZMQ ROUTER that speaks the codec.

Every gateway connection is a DEALER; the ROUTER sees its identity first on each frame set, and
replies go back to that identity.
"""

from __future__ import annotations

import logging

import zmq

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.messages import Message

log = logging.getLogger(__name__)

Incoming = tuple[bytes, Message | ProtocolError]


class WorkerChannel:
    """A bound ROUTER socket. Synchronous: the worker's engine thread owns it."""

    def __init__(self, endpoint: str, context: zmq.Context | None = None) -> None:  # type: ignore[type-arg]
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Token frames must never be dropped silently: backpressure is the scheduler's queue limit.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.bind(endpoint)
        self.endpoint = endpoint
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)

    def recv_ready(self, timeout_ms: int, limit: int = 1024) -> list[Incoming]:
        """Everything that arrives within ``timeout_ms`` (at most ``limit`` frame sets)."""
        out: list[Incoming] = []
        if not self.poller.poll(timeout_ms):
            return out
        while len(out) < limit:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            out.append(self._decode(frames))
        return out

    def send(self, client: bytes, msg: Message) -> None:
        self.socket.send_multipart([client, *codec.encode(msg)])

    def close(self) -> None:
        self.socket.close(linger=0)

    @staticmethod
    def _decode(frames: list[bytes]) -> Incoming:
        client, rest = frames[0], frames[1:]
        try:
            return client, codec.decode(rest)
        except ProtocolError as exc:
            log.warning("rejected a frame set from %r: %s", client[:16], exc.message)
            return client, exc
