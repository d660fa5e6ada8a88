"""A fake worker that speaks the real protocol over a real ZMQ ROUTER, in a background thread.

It answers ``Ping`` with ``Pong`` and each ``Generate`` with a scripted reply, a few words per
tick, coalescing some ticks into ``Events``. Words in the prompt change the script:

- ``ERROR:<code>``: answer with ``Error(code)`` at once (e.g. ``ERROR:overloaded``, which
  carries ``retry_after_s=OVERLOADED_RETRY_S`` as a worker's measured drain rate would).
- ``MIDERROR:<code>``: stream two pieces, then ``Error(code)``.
- ``SLOW``: a long reply at ``slow_tick_s`` per tick (time for a client to disconnect).
- ``SILENT``: never answer (time for a timeout).
- ``EMPTY``: finish at once with no text.
- ``FLOOD``: ``FLOOD_PIECES`` pieces of 4 KiB as fast as it can (a client that cannot keep up).
- ``SEEDED``: reply ``seed <n> .`` with the request's seed (which choice got which seed).
- ``CACHED:<n>``: report ``n`` cached prompt tokens in the usage.
- ``JSONCALL``: reply ``JSON_CALL``, a call's bare JSON body (what a forced tool_choice gets).
- ``THINK``: reply ``THINK_REPLY`` in 3-character pieces (markers split across deltas), its first
  delta naming the ``<think>`` markers, as a thinking model's worker does; ``THINKOPEN``: the
  same without the opening marker, the first delta saying the output starts inside thinking.
  ``THINKCALL``: ``THINK_CALL_REPLY`` the same way: a ``<tool_call>`` written inside thinking,
  then an answer with a call of its own.
- ``TOOLCALL``: reply ``TOOL_REPLY`` (text, then a ``<tool_call>``; one more call per further
  ``TOOLCALL``) in 5-character pieces, so the tags arrive split across deltas.

Each ``Embed`` gets ``Embeddings`` at once: per input a 4-float vector whose first float is the
input's number of words (or token ids), e.g. ``[2, 0, 0, 0]`` for ``"hello world"``; an input
containing ``ERROR:<code>`` gets that error instead.

A ``stop`` string found in a piece ends the reply there (``Finished.stop`` names it).
``CountTokens`` is answered with the prompt's word count plus ``TOOL_TOKENS`` per tool.

Every ``Generate`` and ``Cancel`` it receives is recorded for assertions.
"""

from __future__ import annotations

import queue
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import zmq

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.messages import (
    Cancel,
    ChatPrompt,
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
    Prompt,
    TextPrompt,
    Thinking,
    TokenCount,
    TokenDelta,
    TokenPrompt,
    Usage,
)

MODEL = "scripted"
TOOL_TOKENS = 10
DEFAULT_REPLY = "Hello from the scripted worker, one word at a time."
JSON_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOL_REPLY = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)
THINK_REPLY = "<think>\nLet me see.\n</think>\n\nHello there."
THINKING = "Let me see."  # THINK_REPLY's thinking text and answer, split
THINK_CALL_THOUGHT = (
    'Maybe <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> first? No.'
)
THINK_CALL_REPLY = f"<think>\n{THINK_CALL_THOUGHT}\n</think>\n\n{TOOL_REPLY}"
THOUGHT_ANSWER = "Hello there."
SLOW_PIECES = 400
FLOOD_PIECES = 5000
MIDERROR_AFTER = 2
T = TypeVar("T")
OVERLOADED_RETRY_S = 6.2  # what ERROR:overloaded says: the gateway sends Retry-After 7
_TRIGGER = re.compile(r"\b(MIDERROR|ERROR):(\w+)")
_CACHED = re.compile(r"\bCACHED:(\d+)")


@dataclass
class _Active:
    client: bytes
    request_id: str
    pieces: deque[str]
    prompt_tokens: int
    interval_s: float
    next_due: float
    finish_reason: str = "stop"
    error_code: str | None = None
    cached_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    matched_stop: str | None = None
    emitted: list[str] = field(default_factory=list)
    ticks: int = 0
    thinking: Thinking | None = None


class ScriptedWorker:
    """A ROUTER bound on ``endpoint`` that serves scripted completions until ``stop()``.

    Args:
        endpoint: where to bind, e.g. ``ipc:///tmp/x/worker.sock``.
        model: the model name reported in ``Pong``.
        reply: the canned completion text, streamed word by word.
        tick_s: seconds between ticks of a normal request.
        slow_tick_s: seconds between ticks of a ``SLOW`` request.
        tool_parser: the mlx-lm tool parser its ``Pong`` names.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        model: str = MODEL,
        reply: str = DEFAULT_REPLY,
        tick_s: float = 0.002,
        slow_tick_s: float = 0.02,
        tool_parser: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.reply = reply
        self.tick_s = tick_s
        self.slow_tick_s = slow_tick_s
        self.tool_parser = tool_parser
        self.generates: list[Generate] = []
        self.cancels: list[str] = []
        self.bad_frames = 0
        self._changed = threading.Condition()
        self._active: dict[str, _Active] = {}
        self._clients: list[bytes] = []
        self._outbox: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        self._should_exit = threading.Event()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self._thread = threading.Thread(target=self._run, name="scripted-worker", daemon=True)

    # Public API (test thread)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._should_exit.set()
        self._thread.join(timeout=5)
        self._socket.close(linger=0)
        self._context.term()

    def inject(self, frames: list[bytes]) -> None:
        """Send raw ``frames`` (after the identity) to every client seen so far."""
        self._outbox.put(frames)

    def wait_cancel(self, prefix: str, timeout_s: float = 5.0) -> str | None:
        """The first cancelled request id starting with ``prefix``, waiting up to ``timeout_s``."""
        return self._wait(
            lambda: next((c for c in self.cancels if c.startswith(prefix)), None), timeout_s
        )

    def wait_cancels(self, prefix: str, count: int, timeout_s: float = 5.0) -> list[str]:
        """The cancelled request ids starting with ``prefix``, once there are ``count`` of them."""
        found = self._wait(
            lambda: (
                ids
                if len(ids := [c for c in self.cancels if c.startswith(prefix)]) >= count
                else None
            ),
            timeout_s,
        )
        return found or []

    def wait_generate(self, prefix: str, timeout_s: float = 5.0) -> Generate | None:
        """The first Generate whose request id starts with ``prefix``."""
        return self._wait(
            lambda: next((g for g in self.generates if g.request_id.startswith(prefix)), None),
            timeout_s,
        )

    def num_active(self) -> int:
        return len(self._active)

    # The worker thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._should_exit.is_set():
            due = min((a.next_due for a in self._active.values()), default=time.monotonic() + 0.01)
            timeout_ms = max(0.0, min(due - time.monotonic(), 0.01)) * 1000
            if poller.poll(timeout_ms):
                self._drain()
            self._flush_outbox()
            self._tick(time.monotonic())

    def _drain(self) -> None:
        while True:
            try:
                client, *frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if client not in self._clients:
                self._clients.append(client)
            try:
                msg = codec.decode(frames)
            except ProtocolError:
                self.bad_frames += 1
                continue
            self._handle(client, msg)

    def _handle(self, client: bytes, msg: Message) -> None:
        if isinstance(msg, Ping):
            pong = Pong(
                request_id=msg.request_id,
                model=self.model,
                max_context=4096,
                tool_parser=self.tool_parser,
            )
            self._send(client, pong)
        elif isinstance(msg, Generate):
            self._start(client, msg)
        elif isinstance(msg, CountTokens):
            prompt = msg.prompt
            tools = len(prompt.tools or []) if isinstance(prompt, ChatPrompt) else 0
            count = len(_prompt_text(prompt).split()) + TOOL_TOKENS * tools
            self._send(client, TokenCount(request_id=msg.request_id, num_tokens=count))
        elif isinstance(msg, Cancel):
            self._active.pop(msg.request_id, None)
            self._record(self.cancels, msg.request_id)
        elif isinstance(msg, Embed):
            self._send(client, _embeddings(msg))

    def _start(self, client: bytes, gen: Generate) -> None:
        self._record(self.generates, gen)
        text = _prompt_text(gen.prompt)
        trigger = _TRIGGER.search(text)
        if trigger and trigger.group(1) == "ERROR":
            code = trigger.group(2)
            retry = OVERLOADED_RETRY_S if code == "overloaded" else None
            error = Error(
                request_id=gen.request_id,
                code=code,
                message=f"scripted {code}",
                retry_after_s=retry,
            )
            self._send(client, error)
            return
        if "SILENT" in text:
            return
        slow = "SLOW" in text
        pieces = (
            [f"w{i} " for i in range(SLOW_PIECES)] if slow else re.findall(r"\S+\s*", self.reply)
        )
        if "EMPTY" in text:
            pieces = []
        if "FLOOD" in text:
            pieces = ["x" * 4095 + " "] * FLOOD_PIECES
        if "SEEDED" in text:
            pieces = ["seed ", f"{gen.sampling.seed} ", "."]
        if "JSONCALL" in text:
            pieces = [JSON_CALL[i : i + 5] for i in range(0, len(JSON_CALL), 5)]
        if "TOOLCALL" in text:  # one call per mention
            reply = TOOL_REPLY + TOOL_REPLY[len("Let me check. ") :] * (text.count("TOOLCALL") - 1)
            pieces = [reply[i : i + 5] for i in range(0, len(reply), 5)]
        thinking = None
        if "THINK" in text:
            inside = "THINKOPEN" in text
            reply = THINK_CALL_REPLY if "THINKCALL" in text else THINK_REPLY
            reply = reply.removeprefix("<think>") if inside else reply
            pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]
            thinking = Thinking(start="<think>", end="</think>", inside=inside)
        limit = gen.sampling.max_tokens or len(pieces)
        self._active[gen.request_id] = _Active(
            client=client,
            request_id=gen.request_id,
            pieces=deque(pieces[:limit]),
            prompt_tokens=len(text.split()),
            interval_s=self.slow_tick_s if slow else 0.0 if "FLOOD" in text else self.tick_s,
            next_due=time.monotonic(),
            finish_reason="length" if limit < len(pieces) else "stop",
            error_code=trigger.group(2) if trigger else None,
            cached_tokens=int(cached.group(1)) if (cached := _CACHED.search(text)) else 0,
            stop=gen.sampling.stop,
            thinking=thinking,
        )

    def _tick(self, now: float) -> None:
        by_client: dict[bytes, list[Event]] = {}
        for active in [a for a in self._active.values() if a.next_due <= now]:
            by_client.setdefault(active.client, []).extend(self._step(active))
            active.next_due = now + active.interval_s
        for client, events in by_client.items():
            self._send(client, events[0] if len(events) == 1 else Events(events=events))

    def _step(self, active: _Active) -> list[Event]:
        # Odd ticks emit one piece, even ticks two, so both bare messages and Events occur.
        active.ticks += 1
        rid = active.request_id
        events: list[Event] = []
        for _ in range(1 + active.ticks % 2):
            if active.error_code is not None and len(active.emitted) == MIDERROR_AFTER:
                self._active.pop(rid)
                return [*events, Error(request_id=rid, code=active.error_code, message="scripted")]
            if not active.pieces:
                break
            piece = active.pieces.popleft()
            hit = next((s for s in active.stop if s in piece), None)
            if hit is not None:
                piece, active.matched_stop = piece[: piece.index(hit)], hit
                active.pieces.clear()
            active.emitted.append(piece)
            prompt, thinking = None, None
            if len(active.emitted) == 1:  # as the worker does: the first delta has the prompt's
                thinking = active.thinking
                prompt = Usage(
                    prompt_tokens=active.prompt_tokens,
                    completion_tokens=0,
                    cached_tokens=active.cached_tokens,
                )
            events.append(
                TokenDelta(
                    request_id=rid,
                    text=piece,
                    token_ids=[len(active.emitted)],
                    prompt=prompt,
                    thinking=thinking,
                )
            )
        if not active.pieces and active.error_code is None:
            self._active.pop(rid)
            usage = Usage(
                prompt_tokens=active.prompt_tokens,
                completion_tokens=len(active.emitted),
                cached_tokens=active.cached_tokens,
            )
            reason = "stop" if active.matched_stop else active.finish_reason
            events.append(
                Finished(
                    request_id=rid, finish_reason=reason, usage=usage, stop=active.matched_stop
                )
            )
        return events

    def _flush_outbox(self) -> None:
        while True:
            try:
                frames = self._outbox.get_nowait()
            except queue.Empty:
                return
            for client in self._clients:
                self._socket.send_multipart([client, *frames])

    def _send(self, client: bytes, msg: Message) -> None:
        self._socket.send_multipart([client, *codec.encode(msg)])

    def _record(self, log: list[T], item: T) -> None:
        with self._changed:
            log.append(item)
            self._changed.notify_all()

    def _wait(self, find: Callable[[], T | None], timeout_s: float) -> T | None:
        with self._changed:
            self._changed.wait_for(lambda: find() is not None, timeout=timeout_s)
            return find()


def _embeddings(msg: Embed) -> Embeddings | Error:
    sizes = []
    for prompt in msg.inputs:
        text = _prompt_text(prompt)
        trigger = _TRIGGER.search(text)
        if trigger:
            code = trigger.group(2)
            return Error(request_id=msg.request_id, code=code, message=f"scripted {code}")
        sizes.append(
            len(prompt.token_ids) if isinstance(prompt, TokenPrompt) else len(text.split())
        )
    vectors = [struct.pack("<4f", n, 0, 0, 0) for n in sizes]
    usage = Usage(prompt_tokens=sum(sizes), completion_tokens=0)
    return Embeddings(request_id=msg.request_id, dimensions=4, embeddings=vectors, usage=usage)


def _prompt_text(prompt: Prompt) -> str:
    if isinstance(prompt, ChatPrompt):
        return " ".join(str(m.get("content") or "") for m in prompt.messages)
    if isinstance(prompt, TextPrompt):
        return prompt.text
    return " ".join(map(str, prompt.token_ids))
