"""The only hot MLX code: prefill chunks, batched decode steps, sampling.

Decode is pipelined as in mlx-lm: step N+1 is built from step N's lazy tokens and handed to
``mx.async_eval`` before step N's tokens are read back, so host work overlaps device work.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

from mlxd.worker.kv import layer_caches
from mlxd.worker.kv.contiguous import BatchKVCache, SequenceKVCache
from mlxd.worker.sampling import grammar, logprobs
from mlxd.worker.sampling.logprobs import StepLogprobs
from mlxd.worker.sampling.sampling import SampleRow, needs_history, sample
from mlxd.worker.sched.scheduler import PrefillChunk, Scheduler
from mlxd.worker.sched.sequence import Sequence

log = logging.getLogger(__name__)

TokenEvent = tuple[Sequence, int]
# rows, first tokens, their KV, the first tokens' logprobs
_Group = tuple[list[Sequence], mx.array, list[Any], StepLogprobs | None]


def check_model_supported(model: Any) -> str:
    """Why the paged KV cache cannot serve ``model`` ("" when it can).

    The pool holds one plain K/V cache per layer; a layer that masks to a sliding window on a
    plain cache (Mistral 3) gets its window from the pool's masks. Every other layout
    (rotating sliding-window caches, recurrent state, hybrids, shared-KV or cache-less layers,
    cache lists) is served by the contiguous runner on the model's own mlx-lm caches
    (``runners.native``), batched by row.
    """
    if not layer_caches.is_plain(model):
        names = sorted(set(layer_caches.kinds(layer_caches.model_caches(model))))
        return f"{', '.join(names)} layer caches"
    if not layer_caches.batches_rows(model, compare=False):  # the pool's batches are ours
        return "KVCache layers that cannot batch rows of different lengths"
    return ""


class ModelRunner:
    """Owns the decode batch: its rows, their KV caches and their not-yet-read tokens."""

    pads_prompts = True  # whole prompts prefill together, left-padded to one length
    # Decode steps that read the KV pool's blocks because decode's read view would not fit its
    # memory (the paged runner counts them; the contiguous cache has neither). A batch whose rows
    # would pad to over twice their tokens reads the blocks too, uncounted: memory would not help.
    gathered_steps = 0
    speculates = False  # has ``verify_step`` (the paged runner: docs/SPECULATION.md)

    def __init__(self, model: Any, eos_token_ids: set[int], kv_note: str = "") -> None:
        """``kv_note``: why this model decodes on the contiguous cache, for status."""
        self.model = model
        self.kv_note = kv_note
        self.eos_token_ids = sorted(eos_token_ids)
        self.num_layers = len(model.layers)
        self.rows: list[Sequence] = []
        self._batch: list[Any] = self._new_caches(batch=True)
        self._pending: mx.array | None = None  # last sampled token of each row
        self._pending_lp: StepLogprobs | None = None  # their logprobs, for the rows that ask
        self._emitted: list[bool] = []  # whether that token was already handed out
        # Rows whose pending token is their prompt's last one (see ``_read_entered``).
        self._entering: set[Sequence] = set()
        self._prefill: dict[Sequence, list[Any]] = {}

    # Public API

    def fit_scheduler(self, scheduler: Scheduler) -> None:
        """Set what this runner needs on the scheduler that feeds it (a hybrid's prefix cache
        keeps recurrent states, a windowed model's pool has window slabs); nothing here."""

    def prefill(self, chunks: list[PrefillChunk]) -> list[TokenEvent]:
        """Run this step's prompt chunks; sequences whose prompt is done join the decode batch.

        Whole prompts go through one left-padded forward (one launch, one join); a prompt split
        across steps runs alone until its last chunk. Returns each joined sequence's first token.
        """
        whole = [c for c in chunks if c.start == 0 and c.is_last and self.pads_prompts]
        groups = [self._prefill_whole(whole)] if whole else []
        for chunk in chunks:
            if chunk not in whole:
                group = self._prefill_part(chunk)
                if group is not None:
                    groups.append(group)
        if not groups:
            return []
        for _, _, caches, _ in groups:
            self._batch = self._extend(self._batch, caches)
        return self._join([(seqs, first, lp) for seqs, first, _, lp in groups])

    def remove(self, seqs: set[Sequence]) -> None:
        """Drop ``seqs`` from the batch and from prefill; frees their KV."""
        for seq in seqs:
            self._prefill.pop(seq, None)
        self._entering -= seqs
        keep = [i for i, s in enumerate(self.rows) if s not in seqs]
        if len(keep) == len(self.rows):
            return  # only prefill caches (or nothing) went
        self._filter_cache(keep)
        self.rows = [self.rows[i] for i in keep]
        self._emitted = [self._emitted[i] for i in keep]
        self._pending = self._pending[mx.array(keep)] if keep else None  # type: ignore[index]

    def sequences(self) -> list[Sequence]:
        """Every sequence holding KV here: decoding rows and prompts mid-prefill."""
        return self.rows + list(self._prefill)

    def needs_sync(self) -> bool:
        """Penalties need each row's exact history, so unread tokens must be read first."""
        return not all(self._emitted) and any(needs_history(s.sampling) for s in self.rows)

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
        logits = self.model(prev[:, None], cache=self._decode_cache(rows))[:, -1, :]
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
        lost = self.rows + list(self._prefill)
        self.rows, self._emitted, self._pending, self._prefill = [], [], None, {}
        self._pending_lp = None
        self._entering = set()
        self._batch = self._new_caches(batch=True)
        return lost

    @property
    def kv_description(self) -> str:
        why = f"; {self.kv_note}" if self.kv_note else ""
        return f"contiguous (one left-padded cache per decode batch{why})"

    @property
    def kv_bytes(self) -> int:
        single = sum(layer_caches.nbytes(cs) for cs in self._prefill.values())
        return single + layer_caches.nbytes(self._batch)

    @property
    def kv_reserved_bytes(self) -> int:
        """KV memory held now, in use or not (here: the caches of the sequences in flight)."""
        return self.kv_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """The most KV memory the runner holds (0: no cap of its own; rows come and go)."""
        return 0

    # Internal helpers (the cache hooks are what the paged runner replaces)

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

    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        return self._batch  # type: ignore[return-value]

    def _filter_cache(self, keep: list[int]) -> None:
        for layer in self._batch:
            layer.filter(keep)

    def _new_caches(self, batch: bool) -> list[Any]:
        """Empty caches for every layer: the decode batch's (``batch``) or one sequence's."""
        return [BatchKVCache() if batch else SequenceKVCache() for _ in range(self.num_layers)]

    def _extend(self, batch: list[Any], part: list[Any]) -> list[Any]:
        """``batch`` with ``part``'s rows after its own."""
        for mine, theirs in zip(batch, part, strict=True):
            mine.extend(theirs)
        return batch

    def _to_batch(self, single: list[Any]) -> list[Any]:
        """One prefilled sequence's caches as a batch of one row."""
        return [BatchKVCache.from_single(c) for c in single]

    def _join(
        self, groups: list[tuple[list[Sequence], mx.array, StepLogprobs | None]]
    ) -> list[TokenEvent]:
        """Add prefilled rows to the decode batch; returns their first tokens."""
        for seqs, _, _ in groups:
            self.rows += seqs
            self._emitted += [True] * len(seqs)
        firsts = mx.concatenate([first.astype(mx.uint32) for _, first, _ in groups])
        self._pending = firsts if self._pending is None else mx.concatenate([self._pending, firsts])
        seqs = [s for group_seqs, _, _ in groups for s in group_seqs]
        events: list[TokenEvent] = list(zip(seqs, firsts.tolist(), strict=True))  # type: ignore[arg-type]
        for *_, lp in groups:
            if lp is not None:
                lp.attach(dict(events))
        grammar.advance(events)
        return events

    def _prefill_whole(self, chunks: list[PrefillChunk]) -> _Group:
        seqs = [c.seq for c in chunks]
        # prefill_ids: the prompt, and the output so far when computing a sequence again
        width = max(s.num_prefill_tokens for s in seqs)
        pads = [width - s.num_prefill_tokens for s in seqs]
        tokens = mx.array([[0] * p + s.prefill_ids for s, p in zip(seqs, pads, strict=True)])
        caches = [BatchKVCache.for_prefill(pads) for _ in range(self.num_layers)]
        if width > 1:  # the last token apart, as mlx-lm's generate feeds it (see runners.paged)
            self.model(tokens[:, :-1], cache=caches)
        logits = self.model(tokens[:, -1:], cache=caches)[:, -1, :]
        first, lp = self._sample(logits, seqs, [self._sample_row(s, emitted=True) for s in seqs])
        return seqs, first, caches, lp

    def _prefill_part(self, chunk: PrefillChunk) -> _Group | None:
        seq = chunk.seq
        caches = self._prefill.setdefault(seq, self._new_caches(batch=False))
        tokens = mx.array(seq.prefill_ids[chunk.start : chunk.end])[None]
        if chunk.is_last and tokens.shape[1] > 1:  # the last token apart, as in _prefill_whole
            self.model(tokens[:, :-1], cache=caches)
            tokens = tokens[:, -1:]
        logits = self.model(tokens, cache=caches)
        if not chunk.is_last:
            mx.eval(layer_caches.arrays(caches))  # keep the lazy graph one chunk deep
            return None
        first, lp = self._sample(logits[:, -1, :], [seq], [self._sample_row(seq, emitted=True)])
        return [seq], first, self._to_batch(self._prefill.pop(seq)), lp

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
        return SampleRow(
            params=p,
            seed=seq.seed,
            index=index,
            history=history,
            output=seq.output_ids if history else (),
            block_ids=blocked,
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
