"""The contiguous runner: each sequence's K/V in caches of its own, the decode batch's in one.

A prompt prefills into its own caches (``kv.contiguous``; the native runner's are the model's
own mlx-lm caches) and joins the decode batch by appending its rows to the batch's caches; a
row that leaves is filtered out of them. ``--no-paged-kv`` serves plain models on it; the
native runner (``runners.native``) builds on it for models the paged pool cannot hold.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxd.worker.kv import layer_caches
from mlxd.worker.kv.contiguous import BatchKVCache, SequenceKVCache
from mlxd.worker.runners.base import ModelRunner, TokenEvent
from mlxd.worker.sampling import grammar
from mlxd.worker.sampling.logprobs import StepLogprobs
from mlxd.worker.sched.scheduler import PrefillChunk
from mlxd.worker.sched.sequence import Sequence

# rows, first tokens, their KV, the first tokens' logprobs
_Group = tuple[list[Sequence], mx.array, list[Any], StepLogprobs | None]


class ContiguousModelRunner(ModelRunner):
    """``ModelRunner`` whose decode batch is one left-padded cache per layer."""

    pads_prompts = True  # whole prompts prefill together, left-padded to one length

    def __init__(self, model: Any, eos_token_ids: set[int], kv_note: str = "") -> None:
        """``kv_note``: why this model decodes on the contiguous cache, for status."""
        super().__init__(model, eos_token_ids)
        self.kv_note = kv_note
        self.num_layers = len(model.layers)
        self._batch: list[Any] = self._new_caches(batch=True)
        self._prefill: dict[Sequence, list[Any]] = {}  # prompts mid-prefill: their caches

    # Public API

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
        super().remove(seqs)

    def sequences(self) -> list[Sequence]:
        """Every sequence holding KV here: decoding rows and prompts mid-prefill."""
        return super().sequences() + list(self._prefill)

    def reset(self) -> list[Sequence]:
        lost = super().reset() + list(self._prefill)
        self._prefill = {}
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

    # Internal helpers (the cache hooks; the native runner replaces those for its caches)

    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        return self._batch

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
