"""Speculation policy: which rows draft, how many tokens each, and whether the batch drafts at
all this step. Pure Python, no MLX; the runner's ``verify_step`` does the computing.

- **Per row**, prompt lookup (``ngram``) or a draft model (``draft``: a ``Drafter``,
  ``draft_model``) proposes up to the row's draft length, which follows
  its recent acceptance: from the row's decayed counts of accepted and rejected drafts comes
  ``a``, the chance that a draft is kept given the one before it was, and a draft of ``i``
  tokens keeps its last with chance ``a**i``; the row drafts while that is at least ``WORTH``
  (4 tokens before anything is known, 1 to ``MAX_DRAFT`` alone, ``BATCH_DRAFT`` in a batch).
  Rows whose sampling needs their exact history (penalties), requests that opt out
  (``speculate: false``) and rows with no earlier occurrence of their last tokens draft
  nothing and take one position in the forward, as in a plain step.
- **Per batch**, a verification step cannot pipeline (drafts follow from the token just read)
  and costs more than a plain one, so it pays only when it yields enough extra tokens. The
  controller measures each kind's step time per batch-size class (powers of two), over phases
  of ``PHASE`` steps whose first step (the switch) is not counted, and verifies while the
  tokens the rows made from their recent drafts (per row, a decayed mean over verified drafts
  and, in plain steps, drafts scored unverified against the tokens that followed; for a new
  row, what earlier rows made: ``EXPECTED`` at first) are at least the ratio of the two step
  times. So the choice follows the rows in the batch now, not the last verification
  phase's figure: one stream copying code verifies (on an H200: 3.8 tokens for 2.9x a plain
  step), then stops when the copy ends, and a batch of chat rows does not verify at all.
  The mode not chosen is tried again after ``FIRST_BACKOFF``, then twice as many ... up to
  ``MAX_BACKOFF`` phases (after a try that changes the choice, after 1), which refreshes its
  step time and the rows' acceptance; each try also pays two switches (the plain step after a
  verification gathers decode's view again). Phases are counted in the cost of the mode
  tried: a try that costs ``r`` times a phase of the chosen mode (its first step included,
  where a draft model catches up with new rows) comes ``r`` times less often (up to
  ``MAX_DEARER``), and a verification phase whose first ``EARLY`` timed steps lose by
  far (the tokens expected pay for less than ``LOSING`` of their cost) ends there. So a mode
  that costs much more, a draft model whose drafts are rejected, costs a few percent at most
  (run D2 on an H100, where a draft model's step cost about 8x a plain one and its tries ran
  at the pace of cheap ones: 0.40-0.76x). A size class measures plain steps first.
  A verification phase's step where no row had a draft runs plain and is not timed; after
  one, the phase's steps stay pipelined until an unverified draft shows up. A size class not
  measured yet is judged by the nearest measured one's step times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from weakref import WeakKeyDictionary

from mlxd.worker.kv import attention_shapes
from mlxd.worker.sampling.sampling import needs_history
from mlxd.worker.sched.sequence import Sequence
from mlxd.worker.spec.ngram import NgramIndex

MODES = ("ngram", "draft", "off")
MAX_DRAFT = 16  # draft tokens per step of a lone row, at most: it verifies on decode's view,
# where a position costs little (stop 35, H100: edit 4.3 tokens a verification against 3.8)
BATCH_DRAFT = 8  # ... of a row in a batch, where every draft token gathers its row's blocks
WORTH = 0.15  # a draft position is verified while the chance its token is kept is at least this
_DECAY = 0.7  # weight of a row's earlier drafts (verified or shadowed) in its acceptance counts
_PRIOR = (1.5, 0.5)  # (accepted, rejected) before any verification: a first draft of 4
_MADE = 0.8  # weight of a row's earlier drafts in the tokens it is expected to make
_NEW_ROW = 0.98  # weight of earlier drafts (any row's) in what a new row is expected to make
PHASE = 8  # steps one mode runs before the controller decides again
SHADOW_ROWS = 8  # rows whose unverified drafts a plain step scores (``_shadow``)
FIRST_BACKOFF = 8  # phases of the better mode before the worse one's first try
MAX_BACKOFF = 32  # phases of the better mode between two tries of the worse one
MAX_DEARER = 64  # the most a try's cost stretches the wait before the next one
EARLY = 2  # timed steps after which a verification phase that loses by far ends
LOSING = 0.5  # ... by far: the tokens the rows are expected to make pay for less than this
_EMA = 0.5  # weight of a phase's figure in its estimate


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


def draft_length(accepted: float, rejected: float, most: int | None = None) -> int:
    """How many tokens a row with these (decayed) counts drafts, at most ``most`` (default
    ``MAX_DRAFT``; see the module doc)."""
    most = MAX_DRAFT if most is None else most
    a = (accepted + 1.0) / (accepted + rejected + 2.0)
    if a >= 1.0:
        return most
    return max(1, min(most, int(math.log(WORTH) / math.log(a))))


FIRST_DRAFT = draft_length(*_PRIOR)
# Tokens a row not verified yet is expected to make in a verification: its next one, and each
# of a first draft's tokens with the prior's chance a**i (2.4).
EXPECTED = 1.0 + sum(((_PRIOR[0] + 1) / (sum(_PRIOR) + 2)) ** i for i in range(1, FIRST_DRAFT + 1))


@dataclass(slots=True)
class _Estimate:
    step_s: dict[bool, float] = field(default_factory=dict)  # mode (verify?) -> s per step
    switch_s: dict[bool, float] = field(default_factory=dict)  # ... its phases' first step
    backoff: int = FIRST_BACKOFF  # phases of the chosen mode before the other is tried again
    since_try: int = 0  # phases of the chosen mode since
    trying: bool = False  # the phase running is a try of the mode not chosen
    tried: bool | None = None  # a try just ended: its mode (the next choice judges it)
    near: int | None = None  # before both modes are measured: the nearest measured class


class Speculator:
    """Drafts for the rows of a batch, and the batch controller (see the module doc)."""

    def __init__(
        self,
        mode: str = "ngram",
        clock: Callable[[], float] = time.perf_counter,
        drafter: Drafter | None = None,
    ) -> None:
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
        self._made: WeakKeyDictionary[Sequence, float] = WeakKeyDictionary()
        self._new_row = EXPECTED  # what a row not verified yet is expected to make
        self._shadow_turn = 0  # the first row ``_shadow`` scores next
        self._dry = False  # the last proposal had no draft for any row
        self._resumed = False  # this step verifies after pipelined ones (a switch: not timed)
        # In plain steps: (output tokens when drafted, the draft) per row (``_shadow``).
        self._shadows: WeakKeyDictionary[Sequence, tuple[int, list[int]]] = WeakKeyDictionary()
        self._verified = False  # the step running verified drafts
        self._estimates: dict[int, _Estimate] = {}
        self._phase_mode: bool | None = None  # None: no phase running
        self._phase_class = 0
        self._phase_steps = 0
        self._phase_counted = 0  # steps counted (the switch's first is not)
        self._phase_seconds = 0.0
        self._phase_switch: float | None = None  # the phase's first step, in seconds
        self._phase_expect = 1.0  # tokens a row of the phase is expected to make, verifying
        self._last_step: float | None = None
        self._rows = 1  # rows of the step being decided (a lone row drafts up to MAX_DRAFT)

    # Per row

    def eligible(self, seq: Sequence) -> bool:
        p = seq.sampling
        return self.mode != "off" and p.speculate and not needs_history(p)

    def propose(self, rows: list[Sequence]) -> list[list[int]]:
        """Each row's drafts (``[]``: none), at most what its ``max_tokens`` leaves."""
        self._rows = len(rows)
        lengths = [self._length(seq) for seq in rows]
        if self.drafter is not None:
            drafts = self.drafter.propose(rows, lengths)
        else:
            drafts = [self._lookup(seq, k) for seq, k in zip(rows, lengths, strict=True)]
        self._dry = not any(drafts)
        if self._dry:  # nothing to verify: the step is plain, and each row made 1 token
            for seq, k in zip(rows, lengths, strict=True):
                if k > 0:
                    self._learn(seq, [], 1)
        return drafts

    def _lookup(self, seq: Sequence, k: int) -> list[int]:
        """Prompt lookup's draft of up to ``k`` tokens after ``seq``'s tokens."""
        if k <= 0:
            return []
        index = self._index.setdefault(seq, NgramIndex())
        index.sync(seq.prompt_ids, seq.output_ids)
        return index.propose(k)

    def _length(self, seq: Sequence) -> int:
        """How many tokens ``seq`` drafts now (0: none)."""
        if not self.eligible(seq):
            return 0
        room = seq.max_tokens - seq.num_output_tokens - 1
        most = MAX_DRAFT if self._rows <= 1 else BATCH_DRAFT
        return min(draft_length(*self._counts.get(seq, _PRIOR), most), room)

    def expected(self, seq: Sequence) -> float:
        """Tokens ``seq`` is expected to make in a verification step (1 in a plain one)."""
        k = self._length(seq)
        return min(self._made.get(seq, self._new_row), k + 1.0) if k > 0 else 1.0

    def forget(self) -> None:
        """Rows finished: the draft model drops their caches now, not when it next drafts."""
        if self.drafter is not None:
            self.drafter.forget()

    def on_verified(self, rows: list[Sequence], drafts: list[list[int]], kept: list[int]) -> None:
        """``kept[i]``: tokens row ``i`` produced in a verification (its accepted drafts + 1)."""
        c = self.counters
        c.verify_steps += 1
        c.verify_rows += len(rows)
        self._verified = True
        for seq, d, n in zip(rows, drafts, kept, strict=True):
            self._shadows.pop(seq, None)
            self._learn(seq, d, n)
            c.drafted += len(d)
            c.accepted += n - 1

    def _learn(self, seq: Sequence, draft: list[int], kept: int) -> None:
        """Row ``seq`` made ``kept`` tokens from ``draft`` (verified, or in the shadow)."""
        if self.eligible(seq):
            self._made[seq] = _MADE * self._made.get(seq, self._new_row) + (1 - _MADE) * kept
            self._new_row = _NEW_ROW * self._new_row + (1 - _NEW_ROW) * kept
        if draft:
            hits, misses = self._counts.get(seq, _PRIOR)
            self._counts[seq] = (
                _DECAY * hits + kept - 1,
                _DECAY * misses + (kept - 1 < len(draft)),
            )

    def _shadow(self, rows: list[Sequence]) -> None:
        """In plain steps prompt lookup still drafts, unverified, and each draft is scored
        against the tokens its row then makes: what a verification would have made, learnt
        without one, so the controller sees a copy begin (or end) while it runs plain steps.
        (Not for a draft model, whose drafts cost a forward.) At most ``SHADOW_ROWS`` rows a
        step, in turn: scoring all of 64 rows cost about 1.1 ms of host time a step on the
        2-core CPU machine."""
        if self.drafter is not None or not rows:
            return
        n, first = len(rows), self._shadow_turn % len(rows)
        self._shadow_turn = first + SHADOW_ROWS
        for seq in (rows[(first + i) % n] for i in range(min(SHADOW_ROWS, n))):
            k = self._length(seq)
            if k <= 0:
                continue
            start, draft = self._shadows.get(seq, (-1, []))
            if start >= 0:
                kept = _kept(draft, seq.output_ids[start : start + len(draft) + 1])
                if kept is None:
                    continue  # not decided yet
                self._learn(seq, draft, kept)
            self._shadows[seq] = (seq.num_output_tokens, self._lookup(seq, k))

    # Per batch

    def wants(self, rows: list[Sequence]) -> bool:
        """Whether this step should verify drafts (it then reads every row's token first)."""
        self._rows = len(rows)
        if self.mode == "off" or not any(self.eligible(s) for s in rows):
            self._end_phase()
            return False
        if not self.adaptive:
            return True
        size = len(rows).bit_length()
        if self._phase_mode is None or size != self._phase_class or self._phase_steps >= PHASE:
            self._end_phase()
            self._phase_expect = sum(map(self.expected, rows)) / len(rows)
            self._phase_mode, self._phase_class = self._choose(size), size
        if not self._phase_mode:
            self._shadow(rows)
            return False
        if self._dry and self.drafter is None:
            # The last verification found no draft in any row: its step ran plain, but after
            # reading every token first (not pipelined: on an H200, 0.64-0.78x at one stream
            # of chat). Until an unverified draft shows up again, steps stay pipelined.
            self._shadow(rows)
            if not any(self._shadows.get(s, (0, []))[1] for s in rows):
                self._phase_steps += 1
                return False
            self._dry, self._resumed = False, True
        return True

    def on_step(self, speculated: bool, rows: int, clean: bool) -> None:
        """A decode step of ``rows`` rows ended, verifying drafts or not (``speculated``:
        ``wants`` said so, drafts or none); ``clean`` when it ran no prefill (a step with one
        is not a sample of decode's cost, nor is a plain step where no row had a draft)."""
        verified, self._verified = self._verified, False
        if not verified:
            self.counters.plain_rows += rows
        clean = clean and verified == speculated and not self._resumed
        self._resumed = False
        now = self.clock()
        last, self._last_step = self._last_step, now
        if self._phase_mode is None or speculated != self._phase_mode:
            return
        self._phase_steps += 1
        if self._phase_steps == 1 and last is not None:
            self._phase_switch = now - last  # what a try pays to begin (module doc)
        if self._phase_steps == 1 or not clean or last is None:
            return  # a switch's first step pays for the other mode's end
        self._phase_counted += 1
        self._phase_seconds += now - last
        if self._phase_mode and self._losing():
            self._phase_steps = PHASE  # the next ``wants`` ends the phase

    def _losing(self) -> bool:
        """Whether the verification phase running loses by far already (module doc)."""
        est = self._estimates.get(self._phase_class)
        if self._phase_counted < EARLY or est is None or False not in est.step_s:
            return False
        verify_s = self._phase_seconds / self._phase_counted
        return self._phase_expect * est.step_s[False] < LOSING * verify_s

    def _choose(self, size: int) -> bool:
        est = self._estimates.get(size) or self._new_estimate(size)
        if len(est.step_s) < 2 and est.near is None:
            return False in est.step_s  # measure plain steps first, then verification
        # Until both are measured here, the nearest measured class's step times judge.
        times = est if len(est.step_s) == 2 else self._estimates[est.near]  # type: ignore[index]
        better = self._phase_expect * times.step_s[False] >= times.step_s[True]
        if est.tried is not None:  # a try that changes the choice: try the other again soon
            est.backoff = 1 if est.tried == better else min(MAX_BACKOFF, 2 * est.backoff)
            est.tried = None
        est.trying = est.since_try >= est.backoff * _dearer(times, better)
        est.since_try = 0 if est.trying else est.since_try + 1
        return better != est.trying

    def _new_estimate(self, size: int) -> _Estimate:
        """A size class's first estimate: the nearest measured class's step times judge until
        this one's are measured, and the other mode is tried as often as there (a batch
        draining from 64 rows to 1 passes 7 classes; learning each afresh, a verification
        phase and two switches apiece, cost 0.87x where verification loses at every size, in
        a simulation of the H100's step costs)."""
        measured = [c for c, e in self._estimates.items() if len(e.step_s) == 2]
        est = self._estimates[size] = _Estimate()
        if measured:
            est.near = min(measured, key=lambda c: (abs(c - size), c))
            est.backoff = self._estimates[est.near].backoff
        return est

    def _end_phase(self) -> None:
        mode, n = self._phase_mode, self._phase_counted
        if mode is not None and n > 0:
            est = self._estimates.setdefault(self._phase_class, _Estimate())
            est.step_s[mode] = _ema(est.step_s.get(mode), self._phase_seconds / n)
            if self._phase_switch is not None:
                est.switch_s[mode] = _ema(est.switch_s.get(mode), self._phase_switch)
            if est.trying:
                est.tried, est.trying = mode, False
        self._phase_mode, self._phase_switch = None, None
        self._phase_steps, self._phase_counted, self._phase_seconds = 0, 0, 0.0


def _kept(draft: list[int], made: list[int]) -> int | None:
    """The tokens a verification of ``draft`` would have kept, given the tokens the row made
    after it (None: too few made yet to tell)."""
    for j, token in enumerate(made):
        if j == len(draft) or token != draft[j]:
            return j + 1
    return None


def _dearer(est: _Estimate, better: bool) -> float:
    """How many times a phase of the better mode a try of the other costs, its first step
    included (a draft model's first verification after plain steps feeds it every new row's
    prompt: run D3, 64 streams of json at 0.32x while tries ran at a plain phase's pace)."""
    worse = not better
    try_s = est.switch_s.get(worse, est.step_s[worse]) + (PHASE - 1) * est.step_s[worse]
    return min(MAX_DEARER, max(1.0, try_s / (PHASE * est.step_s[better])))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else _EMA * new + (1 - _EMA) * old
