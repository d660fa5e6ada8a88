"""What a worker has done: request counters, token throughput, recent latencies.

The decode loop is hot, so recording is cheap and bounded: counters, per-second token buckets
for the recent window, and fixed-size deques of recent latency samples. Percentiles are computed
only when someone asks (``reply``). Pure Python: no MLX here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxd.errors import MlxdError, Overloaded, WorkerUnavailable
from mlxd.protocol.messages import LatencySummary, StatsReply

if TYPE_CHECKING:
    from mlxd.worker.sched.sequence import Sequence
    from mlxd.worker.spec.speculator import Speculator
    from mlxd.worker.vision.encoder import ImageEncoder

WINDOW_S = 10
MAX_SAMPLES = 2048


@dataclass(frozen=True, slots=True)
class KVReport:
    """The scheduler's KV numbers at one moment (all 0 for the contiguous cache)."""

    preemptions: int = 0
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    block_size: int = 0
    blocks_total: int = 0
    blocks_used: int = 0
    blocks_free: int = 0
    blocks_cached: int = 0


class Stats:
    """Counters since start plus bounded recent samples, fed by the engine's hooks.

    Args:
        clock: the engine's clock (seconds, monotonic).
        window_s: the window of ``output_tps_recent``, in whole seconds.
        max_samples: how many recent TTFT and inter-token samples the percentiles cover.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window_s: int = WINDOW_S,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self.clock = clock
        self.window_s = window_s
        self.started = clock()
        self.requests_admitted = 0
        self.requests_finished = 0
        self.requests_cancelled = 0
        self.requests_errored = 0
        self.requests_rejected = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self._ttft_ms: deque[float] = deque(maxlen=max_samples)
        self._itl_ms: deque[float] = deque(maxlen=max_samples)
        self.decode_steps = 0
        self._step_ms: deque[float] = deque(maxlen=max_samples)
        self._step_rows: deque[int] = deque(maxlen=max_samples)
        self._last_step: float | None = None  # when the last step that decoded ended
        self._last_token: dict[Sequence, float] = {}  # only sequences that are in flight
        self._buckets: deque[list[int]] = deque()  # [second, tokens], at most window_s + 1
        self.speculator: Speculator | None = None  # its counters are reported (the engine's)
        self.vision: ImageEncoder | None = None  # a VLM's encoder: its counters are reported
        self.images = 0
        self._image_buckets: deque[list[int]] = deque()  # [second, images admitted]

    # Hooks (called by the engine)

    def on_admit(self, seq: Sequence) -> None:
        self.requests_admitted += 1
        self.prompt_tokens += seq.num_prompt_tokens  # an image's placeholders included
        if seq.images is not None:
            self.images += len(seq.images.digests)
            self._bump(self._image_buckets, len(seq.images.digests), self.clock())

    def on_refuse(self, exc: MlxdError) -> None:
        """A Generate was not admitted: full queue or draining (rejected), or invalid."""
        if isinstance(exc, Overloaded | WorkerUnavailable):
            self.requests_rejected += 1
        else:
            self.requests_errored += 1

    def on_tokens(self, events: Iterable[tuple[Sequence, int]]) -> None:
        """One step's new tokens: the first of a sequence is a TTFT sample, the rest are
        inter-token samples. O(rows)."""
        now = self.clock()
        num = 0
        for seq, _ in events:
            if seq.is_finished:
                continue
            num += 1
            last = self._last_token.get(seq)
            if last is None:
                self._ttft_ms.append((now - seq.arrival) * 1000.0)
            else:
                self._itl_ms.append((now - last) * 1000.0)
            self._last_token[seq] = now
        if num:
            self._count(num, now)

    def on_step(self, rows: int) -> None:
        """A scheduling step ended having decoded ``rows`` rows (0: none). Each decode step that
        directly follows another is one sample: the time from the end of one to the end of the
        next, everything between them included (prefill chunks, messages, the serving loop)."""
        if not rows:
            self._last_step = None
            return
        now = self.clock()
        self.decode_steps += 1
        if self._last_step is not None:
            self._step_ms.append((now - self._last_step) * 1000.0)
            self._step_rows.append(rows)
        self._last_step = now

    def on_idle(self) -> None:
        """The worker went a loop without a step (no work, or paused): no decode step spans it."""
        self._last_step = None

    def on_finish(self, seq: Sequence, reason: str) -> None:
        """``reason``: "stop"/"length" (finished), "cancelled" or "error"."""
        self._last_token.pop(seq, None)
        if reason == "cancelled":
            self.requests_cancelled += 1
        elif reason == "error":
            self.requests_errored += 1
        else:
            self.requests_finished += 1

    # Public API

    def uptime_s(self) -> float:
        return self.clock() - self.started

    def output_tps_recent(self) -> float:
        """Output tokens per second over the last ``window_s`` seconds (or since start)."""
        return self._rate(self._buckets)

    def images_per_s_recent(self) -> float:
        """Images admitted per second over the last ``window_s`` seconds (or since start)."""
        return self._rate(self._image_buckets)

    def reply(
        self, request_id: str, kv: KVReport | None = None, gathered_steps: int = 0
    ) -> StatsReply:
        """Everything as a ``StatsReply``; sorts the recent samples, so call it rarely.

        ``kv``: the KV pool's and prefix cache's numbers, when the worker has a paged cache;
        ``gathered_steps``: the runner's decode steps that read the pool's blocks."""
        uptime = self.uptime_s()
        kv = kv or KVReport()
        return StatsReply(
            request_id=request_id,
            uptime_s=uptime,
            requests_admitted=self.requests_admitted,
            requests_finished=self.requests_finished,
            requests_cancelled=self.requests_cancelled,
            requests_errored=self.requests_errored,
            requests_rejected=self.requests_rejected,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            output_tps_recent=self.output_tps_recent(),
            output_tps_total=self.output_tokens / uptime if uptime > 0 else 0.0,
            ttft=summarize(self._ttft_ms),
            itl=summarize(self._itl_ms),
            decode_steps=self.decode_steps,
            decode_step=summarize(self._step_ms),
            decode_rows_mean=_mean(self._step_rows),
            decode_gathered_steps=gathered_steps,
            preemptions=kv.preemptions,
            prefix_cache_hits=kv.hits,
            prefix_cache_hit_tokens=kv.hit_tokens,
            prefix_cache_misses=kv.misses,
            kv_block_size=kv.block_size,
            kv_blocks_total=kv.blocks_total,
            kv_blocks_used=kv.blocks_used,
            kv_blocks_free=kv.blocks_free,
            kv_blocks_cached=kv.blocks_cached,
            images=self.images,
            images_encoded=0 if self.vision is None else self.vision.counters.encoded,
            vision_encode_s=0.0 if self.vision is None else self.vision.counters.seconds,
            images_per_s_recent=self.images_per_s_recent(),
            **self._speculation(),
        )

    def _speculation(self) -> dict[str, float | int | str]:
        if self.speculator is None:
            return {}
        c = self.speculator.counters
        return {
            "speculation": self.speculator.mode,
            "spec_drafted_tokens": c.drafted,
            "spec_accepted_tokens": c.accepted,
            "spec_acceptance_rate": c.acceptance_rate,
            "tokens_per_forward": c.tokens_per_forward,
            "decode_row_forwards": c.verify_rows + c.plain_rows,
        }

    # Internal helpers

    def _count(self, num: int, now: float) -> None:
        self.output_tokens += num
        self._bump(self._buckets, num, now)

    def _bump(self, buckets: deque[list[int]], num: int, now: float) -> None:
        """``num`` more in ``now``'s second of ``buckets`` (one per second of the window)."""
        second = math.floor(now)
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += num
            return
        buckets.append([second, num])
        while buckets[0][0] <= second - self.window_s:
            buckets.popleft()

    def _rate(self, buckets: deque[list[int]]) -> float:
        """Per second over the last ``window_s`` seconds of ``buckets`` (or since start)."""
        now = self.clock()
        first = math.floor(now) - self.window_s + 1
        total = sum(n for second, n in buckets if second >= first)
        span = now - max(float(first), self.started)
        return total / span if span > 0 else 0.0


def _mean(values: deque[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(samples: Iterable[float]) -> LatencySummary:
    """Nearest-rank p50/p95/p99 of ``samples`` (all 0 when there are none)."""
    ordered = sorted(samples)
    if not ordered:
        return LatencySummary(num_samples=0, p50_ms=0.0, p95_ms=0.0, p99_ms=0.0)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return LatencySummary(
        num_samples=len(ordered), p50_ms=rank(0.50), p95_ms=rank(0.95), p99_ms=rank(0.99)
    )
