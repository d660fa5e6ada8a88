"""Speculation policy: which rows draft, how many tokens each, and whether the batch drafts at
all this step. Pure Python, no MLX; the runner's ``verify_step`` does the computing.

- **Per row**, prompt lookup (``ngram``) or a draft model (``draft``: a ``Drafter``,
  ``draft_model``) proposes up to the row's draft length, which follows
  its recent acceptance: from the row's decayed counts of accepted and rejected drafts comes
  ``a``, the chance that a draft is kept given the one before it was, and a draft of ``i``
  tokens keeps its last with chance ``a**i``; the row drafts while that is at least ``WORTH``
  (4 tokens before anything is known, 1 to ``MAX_DRAFT``). Rows whose sampling needs their
  exact history (penalties), requests that opt out (``speculate: false``) and rows with no
  earlier occurrence of their last tokens draft nothing and take one position in the forward,
  as in a plain step.
- **Per batch**, a verification step cannot pipeline (drafts follow from the token just read)
  and costs more than a plain one, so it pays only when it yields enough extra tokens. The
  controller measures both kinds of step as tokens per second of wall time, per batch-size
  class (powers of two), over phases of ``PHASE`` steps whose first step (the switch) is not
  counted, and runs the better one. The worse one is tried again after ``FIRST_BACKOFF``,
  then twice as many ... up to ``MAX_BACKOFF`` phases of the better one (after a try that
  wins, after 1), so a stale figure is corrected and a losing mode costs at most one phase in
  ``FIRST_BACKOFF + 1``; each try also pays two switches (the plain step after a verification
  gathers decode's view again).
  A size class not measured yet starts from the nearest measured one's choice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from weakref import WeakKeyDictionary

from mlxd.worker import attention_shapes
from mlxd.worker.ngram import NgramIndex
from mlxd.worker.sampling import needs_history
from mlxd.worker.sequence import Sequence

MODES = ("ngram", "draft", "off")
MAX_DRAFT = 8  # draft tokens per row and step, at most
WORTH = 0.15  # a draft position is verified while the chance its token is kept is at least this
_DECAY = 0.7  # weight of a row's earlier verifications in its acceptance counts
_PRIOR = (1.5, 0.5)  # (accepted, rejected) before any verification: a first draft of 4
PHASE = 8  # steps one mode runs before the controller decides again
FIRST_BACKOFF = 8  # phases of the better mode before the worse one's first try
MAX_BACKOFF = 32  # phases of the better mode between two tries of the worse one
_EMA = 0.5  # weight of a phase's figure in its mode's estimate


@dataclass(slots=True)
class SpeculationCounters:
    """Since the worker started: verification steps and the rows they verified, draft tokens
    proposed and accepted, tokens those rows produced; plain decode rows for the ratio."""

    verify_steps: int = 0
    verify_rows: int = 0
    drafted: int = 0
    accepted: int = 0
    plain_rows: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per row and decode forward, verification and plain steps together (1.0
        without speculation)."""
        rows = self.verify_rows + self.plain_rows
        return (rows + self.accepted) / rows if rows else 0.0

    def since(self, before: SpeculationCounters) -> SpeculationCounters:
        """The counts after ``before`` (a copy taken earlier): one benchmark level's."""
        return SpeculationCounters(*(getattr(self, f) - getattr(before, f) for f in _FIELDS))


_FIELDS = ("verify_steps", "verify_rows", "drafted", "accepted", "plain_rows")


class Drafter(Protocol):
    """What proposes drafts with ``draft``: ``draft_model.DraftModel`` (which computes)."""

    def propose(self, rows: list[Sequence], lengths: list[int]) -> list[list[int]]:
        """Up to ``lengths[i]`` draft tokens after row ``i``'s tokens (``[]`` for 0)."""
        ...

    def forget(self) -> None:
        """Drop what finished rows hold."""
        ...


def resolve(mode: str) -> str:
    """``auto``: prompt lookup, except where multi-query attention builds a plan per shape (CUDA:
    ``attention_shapes``). There a verification step cost about 3.5x a decode step on an H100
    (1 stream: 0.60x the tokens per second with 2.2 tokens per forward; docs/PERFORMANCE.md)."""
    if mode != "auto":
        return mode
    return "off" if attention_shapes.PLANNED else "ngram"


def draft_length(accepted: float, rejected: float) -> int:
    """How many tokens a row with these (decayed) counts drafts (see the module doc)."""
    a = (accepted + 1.0) / (accepted + rejected + 2.0)
    if a >= 1.0:
        return MAX_DRAFT
    return max(1, min(MAX_DRAFT, int(math.log(WORTH) / math.log(a))))


FIRST_DRAFT = draft_length(*_PRIOR)


@dataclass(slots=True)
class _Estimate:
    tps: dict[bool, float] = field(default_factory=dict)  # mode (speculate?) -> tokens/s
    backoff: int = FIRST_BACKOFF  # phases of the better mode before the worse is tried again
    since_try: int = 0  # phases of the better mode since
    trying: bool = False  # the phase running is a try of the worse mode
    prior: bool | None = None  # before both modes are measured: a neighbour class's better one


class Speculator:
    """Drafts for the rows of a batch, and the batch controller (see the module doc)."""

    def __init__(self, mode: str = "ngram", clock: Callable[[], float] = time.perf_counter,
                 drafter: Drafter | None = None) -> None:  # fmt: skip
        """``drafter``: the draft model, in mode ``draft`` (and only then)."""
        assert mode in MODES, mode
        assert (mode == "draft") == (drafter is not None), "a draft model drafts in 'draft' only"
        self.mode = mode
        self.drafter = drafter
        self.adaptive = True  # False: every step with a row that may draft verifies (tests)
        self.clock = clock
        self.counters = SpeculationCounters()
        # Per row, as long as its sequence lives (a preempted one keeps both).
        self._index: WeakKeyDictionary[Sequence, NgramIndex] = WeakKeyDictionary()
        self._counts: WeakKeyDictionary[Sequence, tuple[float, float]] = WeakKeyDictionary()
        self._verified = False  # the step running verified drafts
        self._estimates: dict[int, _Estimate] = {}
        self._phase_mode: bool | None = None  # None: no phase running
        self._phase_class = 0
        self._phase_steps = 0
        self._phase_tokens = 0
        self._phase_seconds = 0.0
        self._last_step: float | None = None

    # Per row

    def eligible(self, seq: Sequence) -> bool:
        p = seq.sampling
        return self.mode != "off" and p.speculate and not needs_history(p)

    def propose(self, rows: list[Sequence]) -> list[list[int]]:
        """Each row's drafts (``[]``: none), at most what its ``max_tokens`` leaves."""
        lengths = [self._length(seq) for seq in rows]
        if self.drafter is not None:
            return self.drafter.propose(rows, lengths)
        out: list[list[int]] = []
        for seq, k in zip(rows, lengths, strict=True):
            if k <= 0:
                out.append([])
                continue
            index = self._index.setdefault(seq, NgramIndex())
            index.sync(seq.prompt_ids, seq.output_ids)
            out.append(index.propose(k))
        return out

    def _length(self, seq: Sequence) -> int:
        """How many tokens ``seq`` drafts now (0: none)."""
        if not self.eligible(seq):
            return 0
        room = seq.max_tokens - seq.num_output_tokens - 1
        return min(draft_length(*self._counts.get(seq, _PRIOR)), room)

    def forget(self) -> None:
        """Rows finished: the draft model drops their caches now, not when it next drafts."""
        if self.drafter is not None:
            self.drafter.forget()

    def on_verified(self, rows: list[Sequence], drafts: list[list[int]],
                    kept: list[int]) -> None:  # fmt: skip
        """``kept[i]``: tokens row ``i`` produced in a verification (its accepted drafts + 1)."""
        c = self.counters
        c.verify_steps += 1
        c.verify_rows += len(rows)
        self._verified = True
        for seq, d, n in zip(rows, drafts, kept, strict=True):
            if not d:
                continue
            accepted = n - 1
            c.drafted += len(d)
            c.accepted += accepted
            hits, misses = self._counts.get(seq, _PRIOR)
            self._counts[seq] = (_DECAY * hits + accepted,
                                 _DECAY * misses + (accepted < len(d)))  # fmt: skip

    # Per batch

    def wants(self, rows: list[Sequence]) -> bool:
        """Whether this step should verify drafts (it then reads every row's token first)."""
        if self.mode == "off" or not any(self.eligible(s) for s in rows):
            self._end_phase()
            return False
        if not self.adaptive:
            return True
        size = len(rows).bit_length()
        if self._phase_mode is None or size != self._phase_class or self._phase_steps >= PHASE:
            self._end_phase()
            self._phase_mode, self._phase_class = self._choose(size), size
        return self._phase_mode

    def on_step(self, speculated: bool, rows: int, tokens: int, clean: bool) -> None:
        """A decode step ended: ``tokens`` produced by ``rows`` rows, verifying drafts or not
        (``speculated``: ``wants`` said so, drafts or none); ``clean`` when it ran no prefill
        (a step with one is not a sample of decode's cost)."""
        if not self._verified:
            self.counters.plain_rows += rows
        self._verified = False
        now = self.clock()
        last, self._last_step = self._last_step, now
        if self._phase_mode is None or speculated != self._phase_mode:
            return
        self._phase_steps += 1
        if self._phase_steps == 1 or not clean or last is None:
            return  # a switch's first step pays for the other mode's end
        self._phase_tokens += tokens
        self._phase_seconds += now - last

    def _choose(self, size: int) -> bool:
        est = self._estimates.get(size) or self._new_estimate(size)
        if len(est.tps) < 2 and est.prior is None:
            return True not in est.tps  # measure speculation first, then plain steps
        better = est.prior if len(est.tps) < 2 else est.tps[True] >= est.tps[False]
        est.trying = est.since_try >= est.backoff
        est.since_try = 0 if est.trying else est.since_try + 1
        return better != est.trying

    def _new_estimate(self, size: int) -> _Estimate:
        """A size class's first estimate: the nearest measured class's better mode runs first
        and the other is tried as often as there (a batch draining from 64 rows to 1 passes
        7 classes; learning each afresh, a verification phase and two switches apiece, cost
        0.87x where verification loses at every size, in a simulation of the H100's step
        costs)."""
        measured = [c for c, e in self._estimates.items() if len(e.tps) == 2]
        est = self._estimates[size] = _Estimate()
        if measured:
            near = self._estimates[min(measured, key=lambda c: (abs(c - size), c))]
            est.prior, est.backoff = near.tps[True] >= near.tps[False], near.backoff
        return est

    def _end_phase(self) -> None:
        mode, seconds = self._phase_mode, self._phase_seconds
        if mode is not None and seconds > 0:
            est = self._estimates.setdefault(self._phase_class, _Estimate())
            tps = self._phase_tokens / seconds
            old = est.tps.get(mode)
            est.tps[mode] = tps if old is None else _EMA * tps + (1 - _EMA) * old
            if est.trying:  # the worse mode's try: still worse, try less often; else again soon
                won = len(est.tps) == 2 and mode == (est.tps[True] >= est.tps[False])
                est.backoff = 1 if won else min(MAX_BACKOFF, 2 * est.backoff)
                est.trying = False
        self._phase_mode = None
        self._phase_steps, self._phase_tokens, self._phase_seconds = 0, 0, 0.0
