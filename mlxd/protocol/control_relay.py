"""The control socket's own thread: answers pings at once, relays every other command to the
engine thread.

The engine thread runs control commands between steps, and one step can take many seconds: a
long prefill chunk, or the first CUDA kernel compiles for a new shape. A supervisor pinging
through the engine thread would take such a busy worker for a hung one and kill it, again and
again. So the relay owns the control ROUTER on a thread of its own: a ``Ping`` is answered right
there (the answer says how long the engine has been busy, so a truly stuck engine is still
caught), everything else crosses an inproc PAIR to the engine thread, and the engine's replies
cross back. MLX releases the GIL while it evaluates, so the relay keeps running during steps.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

import zmq

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.messages import Message

log = logging.getLogger(__name__)

POLL_MS = 50  # how often the thread looks at its stop flag when nothing arrives
CONTROL_LINGER_MS = 500  # a shutdown's Ack may still be in flight when the worker exits

_ids = itertools.count()


class ControlRelay:
    """A bound control ROUTER served by a background thread.

    Args:
        context: the worker's ZMQ context (the inproc link needs the engine side's context).
        endpoint: where to bind the control socket.
        answer: called on the relay thread with each decoded message; a reply it returns is sent
            at once, ``None`` passes the message on to the engine thread. It must only read
            state that is safe to read while the engine thread changes it (fields set once,
            a float).
        secure: applies CURVE server keys to the ROUTER (tcp:// endpoints) before it binds.
    """

    def __init__(
        self,
        context: zmq.Context,  # type: ignore[type-arg]
        endpoint: str,
        *,
        answer: Callable[[Message], Message | None],
        secure: Callable[[zmq.Socket], None],  # type: ignore[type-arg]
    ) -> None:
        self._answer = answer
        self._router = context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        secure(self._router)
        self._router.bind(endpoint)
        inproc = f"inproc://mlxd-control-{next(_ids)}"
        self._inner = context.socket(zmq.PAIR)
        self._inner.bind(inproc)
        # The engine thread's end: frames are [client identity, *payload] both ways.
        self.engine_side = context.socket(zmq.PAIR)
        self.engine_side.connect(inproc)
        self._stop = threading.Event()
        # Sockets made here are used only by the thread from start() on (start is the barrier).
        self._thread = threading.Thread(target=self._run, name="mlxd-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Send what the engine already replied (a shutdown's Ack), then stop the thread."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.engine_side.close(linger=0)

    # Internal helpers

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._inner, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if self._router in ready:
                    self._from_clients()
                if self._inner in ready:
                    self._from_engine()
            self._from_engine()
        except zmq.ZMQError as exc:  # the context was terminated under us: the worker is exiting
            log.debug("control relay stopped: %s", exc)
        finally:
            self._router.close(linger=CONTROL_LINGER_MS)
            self._inner.close(linger=0)

    def _from_clients(self) -> None:
        for frames in _drain(self._router):
            reply = self._fast_reply(frames[1:])
            if reply is None:
                self._inner.send_multipart(frames)
            else:
                self._router.send_multipart([frames[0], *codec.encode(reply)])

    def _fast_reply(self, payload: list[bytes]) -> Message | None:
        try:
            msg = codec.decode(payload)
        except ProtocolError:
            return None  # the engine thread answers it with the typed error (and logs it)
        return self._answer(msg)

    def _from_engine(self) -> None:
        for frames in _drain(self._inner):
            self._router.send_multipart(frames)


def _drain(sock: zmq.Socket) -> list[list[bytes]]:  # type: ignore[type-arg]
    out: list[list[bytes]] = []
    while True:
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return out
