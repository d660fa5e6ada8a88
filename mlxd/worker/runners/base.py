"""The model runner's contract: the decode batch's rows, their not-yet-read tokens, sampling.

Every runner (contiguous, native, paged, hybrid, window) is a ``ModelRunner``: it owns the rows
decoding together and the tokens sampled for them but not yet read, and shares the decode step,
sampling (grammar masks, penalties' history, logprobs) and the reading of tokens. What differs
is where K/V lives: each runner runs its own prefill and hands each decode step its caches.

Decode is pipelined as in mlx-lm: step N+1 is built from step N's lazy tokens and handed to
``mx.async_eval`` before step N's tokens are read back, so host work overlaps device work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import mlx.core as mx

from mlxd.worker.sampling import grammar, logprobs
from mlxd.worker.sampling.logprobs import StepLogprobs
from mlxd.worker.sampling.sampling import SampleRow, needs_history, sample
from mlxd.worker.sched.scheduler import PrefillChunk, Scheduler
from mlxd.worker.sched.sequence import Sequence

TokenEvent = tuple[Sequence, int]


class ModelRunner(ABC):
    """Owns the decode batch: its rows and their not-yet-read tokens (their KV: the subclass)."""

    # Decode steps that read the KV pool's blocks because decode's read view would not fit its
    # memory (the paged runner counts them; the contiguous cache has neither). A batch whose rows
    # would pad to over twice their tokens reads the blocks too, uncounted: memory would not help.
    gathered_steps = 0
    speculates = False  # has ``verify_step`` (the paged runner: docs/SPECULATION.md)
    # A VLM's image encoder (vision.encoder.ImageEncoder): prefill splices image features in.
    vision: Any = None

    def __init__(self, model: Any, eos_token_ids: set[int]) -> None:
        self.model = model
        self.eos_token_ids = sorted(eos_token_ids)
        self.rows: list[Sequence] = []
        self._pending: mx.array | None = None  # last sampled token of each row
        self._pending_lp: StepLogprobs | None = None  # their logprobs, for the rows that ask
        self._emitted: list[bool] = []  # whether that token was already handed out
        # Rows whose pending token is their prompt's last one (see ``_read_entered``).
        self._entering: set[Sequence] = set()

    # Public API

    def fit_scheduler(self, scheduler: Scheduler) -> None:  # noqa: B027 - most need nothing
        """Set what this runner needs on the scheduler that feeds it (a hybrid's prefix cache
        keeps recurrent states, a windowed model's pool has window slabs); nothing here."""

    @abstractmethod
    def prefill(self, chunks: list[PrefillChunk]) -> list[TokenEvent]:
        """Run this step's prompt chunks; sequences whose prompt is done join the decode batch.
        Returns the first tokens read now (a runner may read them with the next step)."""

    def remove(self, seqs: set[Sequence]) -> None:
        """Drop ``seqs`` from the decode batch; frees their KV."""
        self._entering -= seqs
        keep = [i for i, s in enumerate(self.rows) if s not in seqs]
        if len(keep) == len(self.rows):
            return  # none of them was decoding
        self._filter_cache(keep)
        self.rows = [self.rows[i] for i in keep]
        self._emitted = [self._emitted[i] for i in keep]
        self._pending = self._pending[mx.array(keep)] if keep else None  # type: ignore[index]

    def sequences(self) -> list[Sequence]:
        """Every sequence holding KV here (here: the decoding rows)."""
        return list(self.rows)

    def needs_sync(self) -> bool:
        """Penalties need each row's exact history, and a row one token from its thinking
        budget its exact state, so unread tokens must be read first."""
        return not all(self._emitted) and any(
            needs_history(s.sampling) or (s.budget is not None and s.budget.near) for s in self.rows
        )

    def sync(self) -> list[TokenEvent]:
        """Read the unread tokens now, without launching a step."""
        out = self._collect(self._pending, self.rows, self._emitted, self._pending_lp)
        self._emitted = [True] * len(self.rows)
        return out

    def decode_step(self) -> list[TokenEvent]:
        """Launch the next decode step for every row, then return the previous step's tokens."""
        prev, prev_lp, rows, emitted = (
            self._pending,
            self._pending_lp,
            list(self.rows),
            self._emitted,
        )
        assert prev is not None, "decode_step needs at least one row"
        sample_rows = [self._sample_row(s, e) for s, e in zip(rows, emitted, strict=True)]
        extra = self._decode_positions(rows)  # before the cache hook advances the rows
        logits = self.model(prev[:, None], cache=self._decode_cache(rows), **extra)[:, -1, :]
        events = None
        if any(s.grammar is not None for s in rows):
            # A grammar mask needs the previous token: read it while the forward pass runs.
            mx.async_eval(logits)
            events = self._collect(prev, rows, emitted, prev_lp)
        self._pending, self._pending_lp = self._sample(logits, rows, sample_rows)
        mx.async_eval(self._pending, *(self._pending_lp.arrays() if self._pending_lp else ()))
        self._emitted = [False] * len(rows)
        if events is None:
            events = self._collect(prev, rows, emitted, prev_lp)
        return events + self._read_entered(rows)

    def needs_room(self) -> bool:
        """Whether the batch's KV is over the runner's own budget, so a row must leave (a
        runner on the paged pool has none: the scheduler accounts for its blocks)."""
        return False

    def has_room(self) -> bool:
        """Whether a new sequence may join (always, but for a runner with its own budget)."""
        return True

    def flush_prefix_cache(self) -> int:
        """Drop the runner's own prefix cache, if it keeps one; returns how many entries went
        (the paged pool's cache is the scheduler's)."""
        return 0

    def free_memory(self) -> None:
        """Give MLX's cache of freed buffers back to the device (after running out of memory)."""
        mx.clear_cache()

    def release_memory(self, highest_used: int) -> int:
        """Idle: give back what the runner holds beyond its blocks up to ``highest_used`` (the
        paged runner's pool; nothing here) and MLX's buffer cache. Returns blocks dropped."""
        self.free_memory()
        return 0

    def reset(self) -> list[Sequence]:
        """Forget the whole batch (after a failed step); returns the sequences that were in it."""
        lost = list(self.rows)
        self.rows, self._emitted, self._pending, self._pending_lp = [], [], None, None
        self._entering = set()
        return lost

    @property
    @abstractmethod
    def kv_description(self) -> str:
        """Where this runner keeps K/V, for status."""

    @property
    @abstractmethod
    def kv_bytes(self) -> int:
        """KV memory the runner's caches hold now."""

    @property
    def kv_reserved_bytes(self) -> int:
        """KV memory held now, in use or not (here: the caches of the sequences in flight)."""
        return self.kv_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """The most KV memory the runner holds (0: no cap of its own; rows come and go)."""
        return 0

    # Internal helpers (the cache hooks are what each runner implements)

    def _enter(self, seqs: list[Sequence]) -> None:
        """Prefilled rows join the decode batch with their prompt's last token as their next
        input (not theirs to emit): it runs in the decode step, as mlx-lm feeds it (see
        ``runners.paged.prefill``), and the step reads their first token back at once."""
        self.rows += seqs
        self._emitted += [True] * len(seqs)
        self._entering.update(seqs)
        last = mx.array([s.prefill_ids[-1] for s in seqs], dtype=mx.uint32)
        self._pending = last if self._pending is None else mx.concatenate([self._pending, last])

    def _read_entered(self, rows: list[Sequence]) -> list[TokenEvent]:
        """The first tokens of rows that entered the batch with their prompt's last token as
        input, read now rather than with the next step: one wait for this step, as a prefill's
        first token had (read with the next step, a first token came one step later: on an
        H100, 19-24 ms of TTFT for one stream against 8-9)."""
        fresh = [s in self._entering for s in rows]
        self._entering.clear()
        if not any(fresh):
            return []
        out = self._collect(self._pending, rows, [not f for f in fresh], self._pending_lp)
        self._emitted = fresh
        return out

    def _decode_positions(self, rows: list[Sequence]) -> dict[str, Any]:
        """A Qwen-VL decode step's ``position_ids`` when a row has images (``vision.mrope``);
        no extra input for any other step or model."""
        mrope = None if self.vision is None else self.vision.mrope
        ids = None if mrope is None else mrope.decode(rows)
        return {} if ids is None else {"position_ids": ids}

    @abstractmethod
    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        """The caches of a decode step of ``rows`` (each writes its next token's K/V)."""

    @abstractmethod
    def _filter_cache(self, keep: list[int]) -> None:
        """Keep only the decode rows at ``keep`` in the caches."""

    @staticmethod
    def _sample(
        logits: mx.array, seqs: list[Sequence], rows: list[SampleRow]
    ) -> tuple[mx.array, StepLogprobs | None]:
        """Sample every row; the hook where per-row extras (grammar masks, logprobs) join the
        step. Logprobs see the raw logits, sampling the constrained ones."""
        tokens = sample(grammar.constrain(logits, seqs), rows)
        return tokens, logprobs.compute(logits, tokens, seqs)

    def _sample_row(self, seq: Sequence, emitted: bool, ahead: int = 0) -> SampleRow:
        """``ahead``: how many draft tokens precede this one (a verification samples after
        each; a row that drafts has no penalties, so its history is not needed)."""
        p = seq.sampling
        index = seq.num_output_tokens + (0 if emitted else 1) + ahead
        blocked = self.eos_token_ids if p.ignore_eos or index < p.min_tokens else ()
        history: list[int] = []
        if needs_history(p):
            history = seq.prompt_ids + seq.output_ids
        due = seq.budget is not None and seq.budget.due and emitted
        return SampleRow(
            params=p,
            seed=seq.seed,
            index=index,
            history=history,
            output=seq.output_ids if history else (),
            block_ids=blocked,
            force_id=seq.budget.end_id if due else None,
        )

    @staticmethod
    def _collect(
        tokens: mx.array | None,
        rows: list[Sequence],
        emitted: list[bool],
        lp: StepLogprobs | None = None,
    ) -> list[TokenEvent]:
        if tokens is None or all(emitted):
            return []
        values = tokens.tolist()
        out: list[TokenEvent] = [
            (s, t)  # type: ignore[misc]
            for s, t, e in zip(rows, values, emitted, strict=True)
            if not e
        ]
        if lp is not None:
            lp.attach(dict(out))
        grammar.advance(out)
        return out
