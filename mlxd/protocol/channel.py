"""The worker's side of the data plane: a ZMQ ROUTER that speaks the codec.

Every gateway connection is a DEALER; the ROUTER sees its identity first on each frame set, and
replies go back to that identity. A second ROUTER, the control socket, takes admin commands on
a thread of its own (``ControlRelay``: pings are answered there, even in the middle of a long
step) and hands the rest to the engine thread over an inproc pair; one poller watches the data
socket and that pair, so the engine thread owns both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from mlxd.errors import ProtocolError
from mlxd.protocol import codec, curve
from mlxd.protocol.control_relay import ControlRelay
from mlxd.protocol.messages import Message

log = logging.getLogger(__name__)

Incoming = tuple[bytes, Message | ProtocolError]


def control_endpoint(endpoint: str) -> str:
    """The control socket that goes with a data endpoint: ``w0.sock`` -> ``w0.ctl.sock``;
    ``tcp://host:PORT`` -> ``tcp://host:PORT+1``; anything else gets ``.ctl`` appended."""
    if endpoint.endswith(".sock"):
        return endpoint.removesuffix(".sock") + ".ctl.sock"
    host, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port.isdigit():
        return f"{host}:{int(port) + 1}"
    return endpoint + ".ctl"


class WorkerChannel:
    """A bound ROUTER socket. Synchronous: the worker's engine thread owns it."""

    def __init__(
        self,
        endpoint: str,
        context: zmq.Context | None = None,  # type: ignore[type-arg]
        keys: curve.CurveKeys | None = None,
    ) -> None:
        self.context = context or zmq.Context.instance()
        self.keys = keys  # CURVE server keys for tcp:// (checked by curve.require)
        self.socket = self.context.socket(zmq.ROUTER)
        self._secure(self.socket, endpoint)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Token frames must never be dropped silently: backpressure is the scheduler's queue limit.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.bind(endpoint)
        self.endpoint = endpoint
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.control: zmq.Socket | None = None  # type: ignore[type-arg]
        self._relay: ControlRelay | None = None

    def bind_control(
        self, endpoint: str, answer: Callable[[Message], Message | None] = lambda msg: None
    ) -> None:
        """Bind the control socket on its relay thread, which replies to what ``answer`` answers
        (on that thread) and passes the rest on; ``recv_ready`` also wakes up for those."""
        relay = ControlRelay(
            self.context, endpoint, answer=answer, secure=lambda sock: self._secure(sock, endpoint)
        )
        self._relay, self.control = relay, relay.engine_side
        self.poller.register(relay.engine_side, zmq.POLLIN)
        relay.start()

    def recv_ready(self, timeout_ms: int, limit: int = 1024) -> list[Incoming]:
        """Everything that arrives within ``timeout_ms`` (at most ``limit`` frame sets)."""
        if not self.poller.poll(timeout_ms):
            return []
        return self._recv_all(self.socket, limit)

    def recv_control(self, limit: int = 64) -> list[Incoming]:
        """Control messages already waiting (no blocking); [] without a control socket."""
        return [] if self.control is None else self._recv_all(self.control, limit)

    def send(self, client: bytes, msg: Message) -> None:
        self.socket.send_multipart([client, *codec.encode(msg)])

    def send_control(self, client: bytes, msg: Message) -> None:
        assert self.control is not None, "bind_control() first"
        self.control.send_multipart([client, *codec.encode(msg)])

    def close(self) -> None:
        self.socket.close(linger=0)
        if self._relay is not None:
            self._relay.close()

    def _secure(self, sock: zmq.Socket, endpoint: str) -> None:  # type: ignore[type-arg]
        keys = curve.require(endpoint, self.keys)
        if keys is not None:
            curve.make_server(sock, keys)

    def _recv_all(self, sock: zmq.Socket, limit: int) -> list[Incoming]:  # type: ignore[type-arg]
        out: list[Incoming] = []
        while len(out) < limit:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            out.append(self._decode(frames))
        return out

    @staticmethod
    def _decode(frames: list[bytes]) -> Incoming:
        client, rest = frames[0], frames[1:]
        try:
            return client, codec.decode(rest)
        except ProtocolError as exc:
            log.warning("rejected a frame set from %r: %s", client[:16], exc.message)
            return client, exc
