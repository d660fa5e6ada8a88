"""Admission and batching policy: which sequences prefill next, which decode, which wait.

Pure Python on ints: no MLX here, so the policy is cheap to import and to unit-test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from mlxd.config import SchedulerConfig
from mlxd.errors import Overloaded
from mlxd.worker.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Prompt tokens ``[start, end)`` of ``seq`` go through the model in this step."""

    seq: Sequence
    start: int
    end: int

    @property
    def is_last(self) -> bool:
        return self.end >= self.seq.num_prompt_tokens


class Scheduler:
    """Keeps the waiting queue (priority with aging), the prefilling and the running sequences."""

    def __init__(self, config: SchedulerConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self.waiting: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []

    # Public API

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; raise ``Overloaded`` when the waiting queue is full."""
        if len(self.waiting) >= self.config.max_queued:
            raise Overloaded(
                f"the queue is full ({self.config.max_queued} waiting requests); retry later",
                retry_after=1.0,
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def schedule_prefill(self) -> list[PrefillChunk]:
        """The prompt chunks to run this step: at most ``prefill_chunk`` tokens in all.

        Sequences already prefilling continue first, so a long prompt finishes before new ones
        start; new sequences are admitted by effective priority while batch slots remain.
        """
        budget = self.config.prefill_chunk
        chunks: list[PrefillChunk] = []
        for seq in self.prefilling:
            if budget <= 0:
                return chunks
            chunk = self._chunk(seq, budget)
            budget -= chunk.end - chunk.start
            chunks.append(chunk)
        while budget > 0 and self.waiting and self._num_slots_used() < self.config.max_num_seqs:
            seq = self._pop_best_waiting()
            self.prefilling.append(seq)
            chunk = self._chunk(seq, budget)
            budget -= chunk.end - chunk.start
            chunks.append(chunk)
        return chunks

    def complete_chunk(self, chunk: PrefillChunk) -> None:
        """Record that ``chunk`` ran; a fully prefilled sequence joins the decode batch."""
        seq = chunk.seq
        seq.num_prefilled = chunk.end
        if chunk.is_last and seq in self.prefilling:
            self.prefilling.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of every queue and mark it finished with ``reason``."""
        for queue in (self.waiting, self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def find(self, request_id: str, client: bytes) -> Sequence | None:
        for queue in (self.waiting, self.prefilling, self.running):
            for seq in queue:
                if seq.request_id == request_id and seq.client == client:
                    return seq
        return None

    def expired(self) -> list[Sequence]:
        """Sequences whose deadline has passed."""
        now = self.clock()
        return [
            s
            for q in (self.waiting, self.prefilling, self.running)
            for s in q
            if s.deadline is not None and s.deadline <= now
        ]

    def effective_priority(self, seq: Sequence, now: float) -> float:
        """Lower runs first: the priority level, improved by one level per ``aging_s`` waited."""
        return seq.priority - (now - seq.arrival) / self.config.aging_s

    def update_config(self, **changes: object) -> None:
        """Apply new limits live (validated by SchedulerConfig)."""
        self.config = replace(self.config, **changes)  # type: ignore[arg-type]

    # Internal helpers

    def _num_slots_used(self) -> int:
        return len(self.running) + len(self.prefilling)

    def _chunk(self, seq: Sequence, budget: int) -> PrefillChunk:
        start = seq.num_prefilled
        return PrefillChunk(seq, start, min(seq.num_prompt_tokens, start + budget))

    def _pop_best_waiting(self) -> Sequence:
        now = self.clock()
        best = min(self.waiting, key=lambda s: (self.effective_priority(s, now), s.arrival))
        self.waiting.remove(best)
        return best
