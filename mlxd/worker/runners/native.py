"""The model runner on a model's own mlx-lm caches, with a snapshot prefix cache.

For every layout the paged pool cannot hold (sliding windows, recurrent state, hybrids,
shared-KV or cache-less layers, cache lists): the caches are exactly what ``make_cache()``
returns, batched by row (``layer_caches``). New prompts with nothing cached prefill together,
right-padded, where a probe at load shows the model gives each the same result so
(``layer_caches.prefills_rows``: each cache masks its rows' padding, as mlx-lm's batch
generator does); the others prefill one sequence at a time.

A prompt first restores the longest snapshot that prefixes it (``snapshot_cache``) and prefills
the rest, stopping to snapshot at its last block boundary and at the longest block-aligned
prefix it shares with an earlier prompt; a sequence that finishes leaves a snapshot of its
prompt and output for the next turn of its conversation.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxd.worker.kv import layer_caches
from mlxd.worker.prefix.snapshot_cache import SnapshotCache
from mlxd.worker.runners.base import TokenEvent
from mlxd.worker.runners.contiguous import ContiguousModelRunner, _Group
from mlxd.worker.sched.scheduler import PrefillChunk
from mlxd.worker.sched.sequence import Sequence, SequenceStatus

_SNAPSHOT_ON_FINISH = ("stop", "length")  # whole outputs; cancelled or failed ones are not


class NativeModelRunner(ContiguousModelRunner):
    """``ContiguousModelRunner`` whose caches are the model's own; prefix hits restore snapshots."""

    pads_prompts = False

    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        snapshots: SnapshotCache | None = None,
        block_size: int = 32,
        kv_note: str = "",
        kv_budget: int | None = None,
    ) -> None:
        """``snapshots``: the prefix cache (None: off); ``block_size``: prompts snapshot at
        their last multiple of it; ``kv_budget``: bytes the batch's caches may hold (None: no
        bound), beyond which no row is admitted and the most recent rows are preempted."""
        super().__init__(model, eos_token_ids, kv_note)
        self.snapshots = snapshots
        self.kv_budget = kv_budget
        self.block_size = block_size
        self.batchable = layer_caches.batches_rows(model)
        self.prefills_together = self.batchable and layer_caches.prefills_rows(model)
        self._fed: list[int] = []  # tokens each decode row's caches hold
        self._have: dict[Sequence, int] = {}  # tokens a prefilling sequence's caches hold
        self._cuts: dict[Sequence, tuple[int, ...]] = {}  # where its prefill snapshots

    # Public API

    def prefill(self, chunks: list[PrefillChunk]) -> list[TokenEvent]:
        """New whole prompts with nothing cached prefill together (``_prefill_together``);
        the others one at a time, as the contiguous runner does."""
        together = self._together(chunks)
        if together:
            self._prefill_together(together)
        return super().prefill([c for c in chunks if c.seq not in together])

    def remove(self, seqs: set[Sequence]) -> None:
        """Finished rows leave a snapshot for the next turn, preempted ones to resume from."""
        if self.snapshots is not None:
            for i, seq in enumerate(self.rows):
                done = seq.finish_reason in _SNAPSHOT_ON_FINISH
                if seq in seqs and (done or seq.status is SequenceStatus.WAITING):
                    self._snapshot_row(i, seq)
        for seq in seqs:
            self._have.pop(seq, None)
            self._cuts.pop(seq, None)
        super().remove(seqs)

    def decode_step(self) -> list[TokenEvent]:
        events = super().decode_step()
        self._fed = [n + 1 for n in self._fed]
        return events

    def needs_room(self) -> bool:
        return (
            self.kv_budget is not None and len(self.rows) > 1 and (self.kv_bytes > self.kv_budget)
        )

    def has_room(self) -> bool:
        """Whether one more row of the batch's average size fits the budget."""
        if self.kv_budget is None or not self.rows:
            return True
        live = self.kv_bytes
        return live + live / len(self.rows) <= self.kv_budget

    def flush_prefix_cache(self) -> int:
        return self.snapshots.clear() if self.snapshots is not None else 0

    def reset(self) -> list[Sequence]:
        self._fed, self._have, self._cuts = [], {}, {}
        return super().reset()

    @property
    def kv_reserved_bytes(self) -> int:
        """The batch's caches and the prefix snapshots (each half the budget at most)."""
        return self.kv_bytes + (self.snapshots.nbytes if self.snapshots is not None else 0)

    @property
    def kv_budget_bytes(self) -> int:
        return 2 * self.kv_budget if self.kv_budget is not None else 0

    @property
    def kv_description(self) -> str:
        prefix = "snapshot prefix cache" if self.snapshots is not None else "no prefix cache"
        rows = "" if self.batchable else ", one sequence at a time"
        return f"contiguous ({self.kv_note}; {prefix}{rows})"

    # Internal helpers: the contiguous runner's cache hooks

    def _new_caches(self, batch: bool) -> list[Any]:
        # The decode batch starts empty: rows join by merging their own caches.
        return [] if batch else layer_caches.model_caches(self.model)

    def _extend(self, batch: list[Any], part: list[Any]) -> list[Any]:
        return layer_caches.extend(batch, part)

    def _to_batch(self, single: list[Any]) -> list[Any]:
        # A model that cannot batch keeps its one row's caches as they are.
        return layer_caches.to_batch(single) if self.batchable else single

    def _filter_cache(self, keep: list[int]) -> None:
        self._batch = layer_caches.keep_rows(self._batch, keep)
        self._fed = [self._fed[i] for i in keep]

    def _join(self, groups: list[tuple[list[Sequence], mx.array, Any]]) -> list[TokenEvent]:
        for seqs, _, _ in groups:
            self._fed += [s.num_prefill_tokens for s in seqs]
            for seq in seqs:
                self._have.pop(seq, None)
                self._cuts.pop(seq, None)
        return super()._join(groups)

    def _prefill_part(self, chunk: PrefillChunk) -> _Group | None:
        seq = chunk.seq
        if seq not in self._prefill:
            self._prefill[seq] = self._restore(seq)
        caches, have = self._prefill[seq], self._have.get(seq, 0)
        cuts = self._cuts.get(seq, ())
        logits = None
        # The last token apart, as in the paged runner (and mlx-lm's generate): some caches'
        # output depends on where prefill splits (deepseek_v41's compressed groups).
        split = (*cuts, chunk.end - 1) if chunk.is_last else cuts
        for start, end in _spans(max(chunk.start, have), chunk.end, split):
            logits = self.model(mx.array(seq.prefill_ids[start:end])[None], cache=caches)
            if end in cuts and self.snapshots is not None:
                self.snapshots.insert(seq.prefill_ids[:end], caches)
        self._have[seq] = max(have, chunk.end)
        if not chunk.is_last or logits is None:
            mx.eval(layer_caches.arrays(caches))  # keep the lazy graph one chunk deep
            return None
        first, lp = self._sample(logits[:, -1, :], [seq], [self._sample_row(seq, emitted=True)])
        return [seq], first, self._to_batch(self._prefill.pop(seq)), lp

    def _together(self, chunks: list[PrefillChunk]) -> list[Sequence]:
        """The sequences of ``chunks`` to prefill in one forward: whole new prompts with no
        snapshot to restore and none to leave but at their end (a prompt that shares a prefix
        with an earlier one stops there to snapshot it, so it goes alone). Each one's caches
        are made here once (``_restore`` records its blocks)."""
        picked = []
        for chunk in chunks:
            seq = chunk.seq
            if (
                not self.prefills_together
                or chunk.start
                or not chunk.is_last
                or (seq in self._prefill or seq.num_prefill_tokens < 2)
            ):
                continue
            self._prefill[seq] = self._restore(seq)
            last = (seq.num_prefill_tokens - 1) // self.block_size * self.block_size
            if not self._have.get(seq) and all(c == last for c in self._cuts.get(seq, ())):
                picked.append(seq)
        return picked if len(picked) > 1 else []

    def _prefill_together(self, seqs: list[Sequence]) -> None:
        """One right-padded forward of the prompts but their last tokens, which enter the
        decode batch (``_enter``); each row leaves a snapshot of its prompt but the last token
        (a repeated prompt or its next turn continues from it)."""
        heads = [s.prefill_ids[:-1] for s in seqs]
        batch, _ = layer_caches.prefill(self.model, [self._prefill.pop(s) for s in seqs], heads)
        if self.snapshots is not None:
            for i, head in enumerate(heads):
                self.snapshots.insert(head, layer_caches.extract(batch, i, self.model))
        self._batch = self._extend(self._batch, batch)
        self._fed += [len(h) for h in heads]
        for seq in seqs:
            self._have.pop(seq, None)
            self._cuts.pop(seq, None)
        self._enter(seqs)

    def _restore(self, seq: Sequence) -> list[Any]:
        """Fresh caches, or the longest snapshot that prefixes ``seq``'s prompt; notes where
        its prefill stops to snapshot."""
        if self.snapshots is None:
            return self._new_caches(batch=False)
        self._cuts[seq] = self._snapshot_points(seq)
        n, caches = self.snapshots.match(seq.prefill_ids)
        if caches is None:
            return self._new_caches(batch=False)
        self._have[seq] = n
        if not seq.num_preemptions:  # a resumed sequence's own tokens are not a cache hit
            seq.num_cached = n
        return caches

    def _snapshot_points(self, seq: Sequence) -> tuple[int, ...]:
        """Where to snapshot ``seq``'s prefill: its prompt's last block boundary before its
        last token, and the longest block-aligned prefix an earlier prompt shared."""
        assert self.snapshots is not None
        n, bs = seq.num_prefill_tokens, self.block_size
        shared = self.snapshots.shared_prefix(seq.prefill_ids, bs)
        return tuple(sorted({c for c in (shared, (n - 1) // bs * bs) if 0 < c < n}))

    def _snapshot_row(self, i: int, seq: Sequence) -> None:
        """Keep decode row ``i``'s caches, which hold its prompt and output so far."""
        tokens = (seq.prompt_ids + seq.output_ids)[: self._fed[i]]
        if len(tokens) != self._fed[i]:
            return  # fed a token past its output (a step ran after it finished)
        caches = (
            layer_caches.extract(self._batch, i, self.model) if self.batchable else (self._batch)
        )
        assert self.snapshots is not None
        self.snapshots.insert(tokens, caches)


def _spans(start: int, end: int, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    """``[start, end)`` split at the ``cuts`` that fall inside."""
    bounds = [start, *(c for c in cuts if start < c < end), end]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b]
