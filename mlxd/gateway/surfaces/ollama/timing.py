"""The durations in Ollama's last message, measured in the gateway (nanoseconds).

``load_duration`` is the time to get the model's worker (loading it if it was not loaded);
``prompt_eval_duration`` from the request's start on the worker to the first token (prefill);
``eval_duration`` from the first token to the last; ``total_duration`` from the request's
arrival to its last token. ``TimedStream`` notes the times as the worker's events pass by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mlxd.gateway.request import EventStream
from mlxd.protocol.messages import Finished, TokenDelta, Usage


@dataclass(slots=True)
class Timing:
    """``time.perf_counter()`` readings of one request."""

    start: float  # the request arrived
    load_s: float  # getting its worker took this long (a load, or nothing)
    opened: float  # the worker was sent the request
    first: float | None = None  # its first token came
    done: float | None = None  # its last one did

    def note(self, event: TokenDelta | Finished | None) -> None:
        """Note the time of an event passing by."""
        if event is None:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        if isinstance(event, Finished):
            self.done = now

    def fields(self, usage: Usage) -> dict[str, int]:
        """Ollama's duration and count fields."""
        done = self.done if self.done is not None else time.perf_counter()
        first = self.first if self.first is not None else done
        return {
            "total_duration": _ns(done - self.start),
            "load_duration": _ns(self.load_s),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": _ns(first - self.opened),
            "eval_count": usage.completion_tokens,
            "eval_duration": _ns(done - first),
        }


class TimedStream:
    """An ``EventStream`` that notes its events' times in a ``Timing``."""

    def __init__(self, stream: EventStream, timing: Timing) -> None:
        self.inner = stream
        self.timing = timing
        self.request_id = stream.request_id

    def __aiter__(self) -> TimedStream:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        event = await anext(self.inner)
        self._note(event)
        return event

    def next_ready(self) -> TokenDelta | Finished | None:
        event = self.inner.next_ready()
        self._note(event)
        return event

    def _note(self, event: TokenDelta | Finished | None) -> None:
        self.timing.note(event)

    @property
    def num_choices(self) -> int:
        return self.inner.num_choices

    @property
    def is_done(self) -> bool:
        return self.inner.is_done

    def index(self, event: TokenDelta | Finished) -> int:
        return self.inner.index(event)

    @property
    def usage(self) -> Usage:
        return self.inner.usage

    async def cancel(self) -> None:
        await self.inner.cancel()


def timing_of(stream: EventStream) -> Timing:
    """The stream's ``Timing``; a fresh one (all durations ~0) when it was not timed."""
    if isinstance(stream, TimedStream):
        return stream.timing
    now = time.perf_counter()
    return Timing(now, 0.0, now, now, now)


def elapsed_ns(start: float) -> int:
    """Nanoseconds since ``start`` (a ``time.perf_counter()`` reading)."""
    return _ns(time.perf_counter() - start)


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))
