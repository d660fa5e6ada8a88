"""The gateway's side of a worker link: one DEALER socket that speaks the codec.

Both of the gateway's clients of a worker use it: the request client (``WorkerClient``, one
long-lived socket read by a reader task) and the control client (``ControlClient``, a socket
dropped after a timeout and reopened on the next command, so a restarted worker never sees a
stale command). The socket's lifecycle (options, CURVE, connect, close) is written once here.
"""

from __future__ import annotations

import zmq
import zmq.asyncio

from mlxd.protocol import codec, curve
from mlxd.protocol.messages import Message


class ClientChannel:
    """A DEALER connected to one worker ROUTER, opened on demand and closed at will.

    Args:
        name: the model name (for the CURVE error message).
        endpoint: the worker's endpoint, ``ipc://...`` or ``tcp://...``.
        keys: CURVE keys, required for ``tcp://`` (``ConfigError`` here, at construction).
        unbounded: no high-water marks, for the data socket: token frames are never dropped
            silently, backpressure is the worker scheduler's queue limit.
    """

    def __init__(
        self, name: str, endpoint: str, keys: curve.CurveKeys | None, unbounded: bool = False
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.keys = curve.require(endpoint, keys)  # a tcp:// link without keys is refused
        self.unbounded = unbounded
        self._socket: zmq.asyncio.Socket | None = None

    @property
    def is_open(self) -> bool:
        return self._socket is not None

    def open(self, context: zmq.asyncio.Context) -> None:
        """Connect the socket unless it is already open."""
        if self._socket is not None:
            return
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.unbounded:
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        if self.keys is not None:
            curve.make_client(sock, self.keys, self.name)
        # No zmq.IMMEDIATE: with it, a reply from a worker that exits right after sending
        # (shutdown) can be lost.
        sock.connect(self.endpoint)
        self._socket = sock

    async def send(self, msg: Message) -> None:
        """Send one message. Raises ``zmq.ZMQError`` (closed socket included)."""
        await self._open_socket().send_multipart(codec.encode(msg))

    async def recv(self) -> Message:
        """The next message. Raises ``ProtocolError`` for a bad frame set (the socket stays
        usable) and ``zmq.ZMQError`` when the socket fails or is closed."""
        return codec.decode(await self._open_socket().recv_multipart())

    def close(self) -> None:
        """Close the socket (nothing still queued is sent); ``open`` makes a new one."""
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def _open_socket(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            raise zmq.ZMQError(zmq.ENOTSOCK, "the channel is closed")
        return self._socket
