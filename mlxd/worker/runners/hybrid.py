"""The paged runner for hybrids: attention layers in the block pool, recurrent state by row.

A hybrid's cache list (``make_cache()``) mixes plain K/V caches, which the pool holds as it does
any model's, with recurrent layers' ``ArraysCache`` (Mamba, Gated DeltaNet, short convolutions):
a fixed-size state per sequence that each token updates instead of adding K/V. Each prefilling
sequence keeps its own state here, and the decode batch one ``ArraysCache`` per recurrent layer
with a row per sequence, joined and filtered as the rows' block tables are.

A state cannot be rebuilt from blocks nor rolled back, so the prefix cache keeps snapshots of it
on radix nodes (``RadixCache.keep_states``), taken where a later prompt can hit: at the last
block boundary of each prefill, about every ``radix_cache.STATE_EVERY`` tokens, where the
scheduler asks (where a prompt parts from the cached blocks, or from a waiting prompt that
shares its first block), and at the last boundary each decoding row passed (a finished
sequence's next turn, a preempted one's resume). A hit restores the blocks by reference and the
state by copy. Spans of one length, from any rows, share a forward; so do spans of one rounded
length where the recurrent layers take padding after a row's tokens (the caches' ``lengths``:
``_takes_padding`` asks the loaded model), which otherwise they would fold into their state.
Drafts are not verified (``speculates``): rejected tokens would have moved the state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from mlxd.config import STATE_FLOOR, STATE_SHARE
from mlxd.worker.kv import attention_shapes, layer_caches
from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep
from mlxd.worker.prefix.radix_cache import state_cuts
from mlxd.worker.runners.paged import PagedModelRunner
from mlxd.worker.sched.scheduler import PrefillChunk, Scheduler
from mlxd.worker.sched.sequence import Sequence

log = logging.getLogger(__name__)

# Rows a prefill step may take a whole chunk of each while no row decodes (``Scheduler.
# prefill_rows``; spans of one (rounded) length share a forward): on an H200, eight 4,000-token
# prompts of a Qwen3.5-0.8B shape took 6.6 s each one after the other, and mlx_lm.server
# prefilled all eight in 10.8 s together (docs/PERFORMANCE.md).
PREFILL_ROWS = 8


def reserved_bytes(model: Any, budget: int, max_num_seqs: int) -> tuple[int, int]:
    """What a hybrid's KV ``budget`` holds before its pool and view: (the prefix cache's
    snapshots, ``STATE_SHARE`` of it; two states per possible row: its live state and its
    latest decode snapshot)."""
    return int(budget * STATE_SHARE), 2 * max_num_seqs * layer_caches.state_bytes(model)


@dataclass(frozen=True)
class _Span:
    """Tokens ``[start, stop)`` of a prefilling sequence, one forward's share of it; its state
    is snapshot after them when ``snapshot``."""

    seq: Sequence
    start: int
    stop: int
    snapshot: bool


@dataclass(frozen=True)
class Snapshot:
    """The recurrent layers' arrays after the first ``tokens`` tokens of one sequence (batch of
    one)."""

    arrays: tuple[tuple[mx.array | None, ...], ...]
    nbytes: int
    tokens: int
    # Each entry's cache class (mlx-vlm's Qwen3.5 layers need mlx-vlm's ``ArraysCache``, whose
    # methods mlx-lm's lacks); empty: mlx-lm's.
    kinds: tuple[type, ...] = ()

    @classmethod
    def of(cls, states: list[ArraysCache], tokens: int, row: int | None = None) -> Snapshot:
        """``states`` as they are (one sequence's), or row ``row`` of the batch's, copied out
        (a slice would keep the whole batch's arrays alive)."""
        pick = None if row is None else mx.array([row])
        arrays = tuple(
            tuple(a if a is None or pick is None else mx.take(a, pick, axis=0) for a in c.cache)
            for c in states
        )
        held = [a for entry in arrays for a in entry if a is not None]
        if pick is not None:
            mx.async_eval(held)
        return cls(arrays, sum(a.nbytes for a in held), tokens, tuple(type(c) for c in states))

    def caches(self) -> list[ArraysCache]:
        """Fresh caches holding these arrays (the model rebinds entries, never writes them)."""
        out = []
        kinds = self.kinds or (ArraysCache,) * len(self.arrays)
        for entry, kind in zip(self.arrays, kinds, strict=True):
            cache = kind(len(entry))
            cache.cache = list(entry)
            out.append(cache)
        return out


class HybridModelRunner(PagedModelRunner):
    """``PagedModelRunner`` for models whose layers are plain K/V caches and recurrent state."""

    speculates = False

    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        pool: KVPool,
        state_budget: int,
        max_view_tokens: int | None = None,
    ) -> None:
        """``state_budget``: bytes the prefix cache's snapshots may hold (the scheduler's radix
        cache keeps them; here for status)."""
        super().__init__(model, eos_token_ids, pool, max_view_tokens)
        self.state_budget = state_budget
        self._attention = layer_caches.attention_entries(layer_caches.model_caches(model))
        self._states: list[ArraysCache] = []  # the decode rows', one per recurrent layer
        self._own: dict[Sequence, tuple[int, list[ArraysCache]]] = {}  # prefilling: tokens, state
        # spans of several lengths share a forward, padded after their tokens (``_takes_padding``)
        self.pads_spans = _takes_padding(model)

    # Public API

    def fit_scheduler(self, scheduler: Scheduler) -> None:
        """Its prefix cache keeps recurrent states, and a step prefills several rows."""
        if scheduler.radix is not None:
            scheduler.radix.keep_states(self.state_budget, self._state_room)
            scheduler.prefill_rows = PREFILL_ROWS

    def decode_step(self) -> list[Any]:
        """A decode step, then a snapshot of each row that has just filled a block."""
        events = super().decode_step()
        bs = self.pool.block_size
        for i, seq in enumerate(self.rows):
            if seq.num_computed % bs == 0:  # the state after this step holds num_computed tokens
                n = seq.num_computed
                seq.states = {n: Snapshot.of(self._states, n, i)}
        return events

    def remove(self, seqs: set[Sequence]) -> None:
        for seq in seqs:
            self._own.pop(seq, None)
        super().remove(seqs)

    def reset(self) -> list[Sequence]:
        """Forget the decode batch; prompts mid-prefill keep their states (evaluated at the end
        of each forward: a failed decode step did not touch them)."""
        self._states = []
        return super().reset()

    def sequences(self) -> list[Sequence]:
        return self.rows + [s for s in self._own if s not in self.rows]

    @property
    def kv_bytes(self) -> int:
        """The pool and view, every row's recurrent state and the snapshots sequences hold
        until the prefix cache takes them (those it holds count in its own budget)."""
        own = sum(layer_caches.nbytes(states) for _, states in self._own.values())
        held = sum(s.nbytes for seq in self.sequences() for s in seq.states.values())
        return super().kv_bytes + own + layer_caches.nbytes(self._states) + held

    @property
    def kv_description(self) -> str:
        recurrent = self._attention.count(False)
        return (
            f"{super().kv_description}; {recurrent} recurrent layers' state by row, prefix "
            f"snapshots up to {self.state_budget / 2**30:.2f} GiB"
        )

    # Internal helpers

    def _state_room(self) -> int:
        """What the prefix cache's snapshots may take now: ``STATE_SHARE`` of it beside the
        pool's arrays as they are (they grow with the sequences in flight), at least
        ``STATE_FLOOR``; so snapshots, as blocks, follow the load instead of filling the whole
        budget over hours (run S1)."""
        return max(STATE_FLOOR, int(self.pool.nbytes * STATE_SHARE / (1 - STATE_SHARE)))

    def _caches(self, paged: list[Any], states: list[ArraysCache]) -> list[Any]:
        """The model's cache list: the pool's layers and the recurrent ones, in its order."""
        p, r = iter(paged), iter(states)
        return [next(p) if a else next(r) for a in self._attention]

    def _groups(self, chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
        return [chunks]  # ``_forward`` groups their spans itself

    def _forward(self, group: list[PrefillChunk]) -> None:
        """Every chunk (without a prompt's last token) in spans between its snapshot cuts; in
        rounds, each row's next span, spans of one length in one forward, or of one rounded
        length, padded after the shorter ones' tokens, where the layers take it (``pads_spans``)."""
        plans = [self._spans(chunk) for chunk in group]
        while any(plans):
            spans = [plan.pop(0) for plan in plans if plan]
            for rows in self._batches(spans):
                if rows[0].stop > rows[0].start:
                    self._run(rows)
                for span in rows:
                    span.seq.num_computed = span.stop
                    states = self._own[span.seq][1]
                    self._own[span.seq] = (span.stop, states)
                    if span.snapshot:
                        span.seq.states[span.stop] = Snapshot.of(states, span.stop)

    def _spans(self, chunk: PrefillChunk) -> list[_Span]:
        """``chunk``'s spans, split at its snapshot cuts; the sequence's state is made ready
        (``_own``) for the first."""
        seq = chunk.seq
        assert chunk.start == seq.num_computed, "a chunk must continue its sequence"
        end = chunk.end - 1 if chunk.is_last else chunk.end
        self._own[seq] = (chunk.start, self._state_at(seq, chunk.start))
        cuts = state_cuts(
            self.pool.block_size, seq.num_prefill_tokens, seq.snapshot_at, chunk.start, end
        )
        stops = sorted(cuts | {end})
        return [
            _Span(seq, a, b, b in cuts) for a, b in zip([chunk.start, *stops], stops, strict=False)
        ]

    def _batches(self, spans: list[_Span]) -> list[list[_Span]]:
        """A round's forwards: spans of one length together, or where padding is taken, of one
        rounded length (``attention_shapes.rounded``: at most a quarter of a forward padding)."""
        size = attention_shapes.rounded if self.pads_spans else int
        groups = sorted({size(s.stop - s.start) for s in spans})
        return [[s for s in spans if size(s.stop - s.start) == g] for g in groups]

    def _state_at(self, seq: Sequence, start: int) -> list[ArraysCache]:
        """The recurrent state after ``seq``'s first ``start`` tokens: none yet, its own from
        the last chunk, or the prefix hit's snapshot."""
        if start == 0:
            caches = layer_caches.model_caches(self.model)
            return [c for c, a in zip(caches, self._attention, strict=True) if not a]
        own = self._own.get(seq)
        if own is not None and own[0] == start:
            return own[1]
        hit, seq.state_hit = seq.state_hit, None  # needed once: not pinned for the row's life
        if hit is None or hit.tokens != start:
            raise RuntimeError(f"no recurrent state for {seq.request_id} at token {start}")
        return hit.caches()  # type: ignore[no-any-return]

    def _run(self, spans: list[_Span]) -> None:
        """One forward of spans of one length, a row each: their states merged for it, then
        each row's copied back into its own caches (a slice would keep the batch's alive)."""
        seqs = [s.seq for s in spans]
        own = [self._own[s][1] for s in seqs]
        starts, lengths = [s.start for s in spans], [s.stop - s.start for s in spans]
        padded = len(set(lengths)) > 1
        step = PagedStep.build(
            [s.block_ids for s in seqs], starts, lengths, self.pool, exact=True, right=padded
        )
        width = max(lengths)
        tokens = mx.array(
            [_right_padded(s.seq.prefill_ids[s.start : s.stop], width) for s in spans]
        )
        states = own[0] if len(own) == 1 else layer_caches.merge(own)
        for cache in states:  # a merge of empty states marks padding there is none of
            cache.left_padding = cache.lengths = None
            if padded:  # each row's state stops at its own last token
                cache.lengths = mx.array(lengths)
        layers = self._caches(PagedKVCache.for_step(self.pool, step), states)
        self.model(tokens, cache=layers, **self._vision_inputs(tokens, spans))
        for cache in states:
            cache.lengths = None
        if len(own) > 1:
            for i, caches in enumerate(own):
                row = mx.array([i])
                for mine, batch in zip(caches, states, strict=True):
                    mine.cache = [
                        None if a is None else mx.take(a, row, axis=0) for a in batch.cache
                    ]
        mx.eval([layer_caches.arrays(caches) for caches in own])  # the graph one forward deep

    def _vision_inputs(self, tokens: mx.array, spans: list[_Span]) -> dict[str, Any]:
        """A VLM's extras for a forward of ``spans`` (each row's columns its span's positions,
        then padding): image features spliced into the embeddings where a span holds
        placeholders, and its rows' mRoPE positions (Qwen3.5); nothing for a text model."""
        if self.vision is None:
            return {}
        width = tokens.shape[1]
        rows = [(s.seq, _right_padded(list(range(s.start, s.stop)), width, -1)) for s in spans]
        extra = self._positions(rows)
        parts = [(s.seq, s.start, s.stop) for s in spans]
        embeds = self.vision.embeddings(tokens, parts, right=True)
        return extra if embeds is None else {**extra, "input_embeddings": embeds}

    def _enter(self, seqs: list[Sequence]) -> None:
        """Rows join with their state: each prefilled all but its prompt's last token."""
        joined = layer_caches.merge([self._own.pop(s)[1] for s in seqs])
        self._states = layer_caches.extend(self._states, joined)
        for cache in self._states:  # a merge of empty states marks padding there is none of
            cache.left_padding = cache.lengths = None  # (after ``extend``: it sizes rows by it)
        super()._enter(seqs)

    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        return self._caches(super()._decode_cache(rows), self._states)

    def _filter_cache(self, keep: list[int]) -> None:
        super()._filter_cache(keep)
        self._states = layer_caches.keep_rows(self._states, keep)


def _right_padded(values: list[int], width: int, fill: int = 0) -> list[int]:
    return values + [fill] * (width - len(values))


def _takes_padding(model: Any) -> bool:
    """Whether ``model``'s recurrent layers leave a row padded after its tokens (the caches'
    ``lengths``) as it would be alone: two rows with state, continued by 3 and 6 tokens in one
    padded forward, against each alone (mlx-lm's Qwen3.5 and Qwen3-Next layers, and mlx-vlm's
    Qwen3.5, take the lengths; a layer that does not would fold the padding into its state)."""
    try:
        rows = [[5, 9, 13, 17, 21], [8, 6, 4, 2, 11]], [[3, 7, 12], [14, 15, 16, 19, 23, 29]]
        together = _recurrent_after(model, rows[0], rows[1])
        alone = [_recurrent_after(model, [p], [c]) for p, c in zip(*rows, strict=True)]
    except Exception:  # noqa: BLE001 - a layer that cannot take the lengths: no padding
        log.debug("recurrent layers take no padding", exc_info=True)
        return False
    return all(
        mx.allclose(a[i : i + 1], b, atol=1e-4).item()
        for i, row in enumerate(alone)
        for a, b in zip(together, row, strict=True)
    )


def _recurrent_after(model: Any, prefix: list[list[int]], more: list[list[int]]) -> list[mx.array]:
    """Every recurrent array after rows ``prefix`` (of one length) then ``more`` (padded after
    the shorter ones, with the caches' ``lengths``), through the model's own caches."""
    caches = layer_caches.model_caches(model)
    model(mx.array(prefix), cache=caches)
    width = max(len(m) for m in more)
    attention = layer_caches.attention_entries(caches)
    recurrent = [c for c, a in zip(caches, attention, strict=True) if not a]
    for cache in recurrent:
        cache.lengths = mx.array([len(m) for m in more]) if len(more) > 1 else None
    model(mx.array([_right_padded(m, width) for m in more]), cache=caches)
    out = [a for c in recurrent for a in c.cache if a is not None]
    mx.eval(out)
    return out
