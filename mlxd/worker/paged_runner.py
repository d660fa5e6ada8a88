"""The model runner on the paged KV cache: every sequence's K/V lives in the block pool.

Prefill chunks (whole prompts, parts of long ones, resumed sequences, suffixes after a prefix
hit) run together in left-padded forwards over their block tables, writing the pool. Decode
steps only read it: their new K/V go to a ``DecodeTail`` that is flushed into the pool before
the next prefill and every few steps, so decode steps pipeline (see ``decode_tail``). Rows join
and leave the batch without copying any K/V: only block tables change, and the scheduler owns
those.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxd.worker.decode_tail import DecodeTail, decode_caches
from mlxd.worker.model_runner import ModelRunner, TokenEvent
from mlxd.worker.paged_cache import KVPool, PagedKVCache, PagedStep
from mlxd.worker.scheduler import PrefillChunk
from mlxd.worker.sequence import Sequence

# A prefill group may pad to at most this many times its real tokens (else it splits).
_MAX_PAD_RATIO = 2


class PagedModelRunner(ModelRunner):
    """``ModelRunner`` whose caches are views of a ``KVPool`` through each row's block table."""

    def __init__(
        self, model: Any, eos_token_ids: set[int], pool: KVPool, max_view_tokens: int | None = None
    ) -> None:
        """``max_view_tokens``: rows x columns decode's read view may hold (see ``decode_tail``);
        by default as many tokens as the pool."""
        super().__init__(model, eos_token_ids)
        self.pool = pool
        self.max_view_tokens = pool.num_blocks * pool.block_size if max_view_tokens is None else (
            max_view_tokens)  # fmt: skip
        self.tail = DecodeTail(self.num_layers, self.max_view_tokens)

    # Public API

    def prefill(self, chunks: list[PrefillChunk]) -> list[TokenEvent]:
        """Run this step's chunks; rows whose prefill is done join the decode batch."""
        joined = []
        if self._pending is not None:
            mx.eval(self._pending)  # a decode step in flight holds the pool: writes would copy it
        # Prefill reads the pool (prefix hits) and must see it all; the flush also completes
        # the last prefill's writes, so these go on top of evaluated arrays.
        self.tail.flush(self.pool)
        for group in _pack(chunks):
            logits = self._forward(group)
            if logits is None:
                mx.eval(self.pool.keys, self.pool.values)  # keep the lazy graph one chunk deep
                continue
            seqs = [c.seq for c in group if c.is_last]
            rows = [self._sample_row(s, emitted=True) for s in seqs]
            first, lp = self._sample(logits, seqs, rows)
            joined.append((seqs, first, lp))
        if not joined:
            return []
        self.tail.restart()  # new rows' tokens are in the pool only: the next step starts there
        return self._join(joined)

    @property
    def kv_bytes(self) -> int:
        """The pool, and decode's view or buffers as they stand (their graph may be unevaluated:
        then the size they will have)."""
        buffers = [b for b in self.tail.keys + self.tail.values if b is not None]
        return self.pool.nbytes + sum(b.nbytes for b in buffers)

    @property
    def kv_description(self) -> str:
        p = self.pool
        view = self.max_view_tokens * p.bytes_per_block // p.block_size
        return (f"paged: {p.num_blocks} blocks of {p.block_size} tokens "
                f"({p.nbytes / 2**30:.2f} GiB), decode view up to {self.max_view_tokens} tokens "
                f"({view / 2**30:.2f} GiB)")  # fmt: skip

    # Internal helpers

    def _forward(self, group: list[PrefillChunk]) -> mx.array | None:
        """``group``'s chunks in left-padded forwards; the logits of the last token of each
        prompt whose last chunk this is (None: no such chunk).

        A prompt's last token runs in a forward of its own, after the rest, as mlx-lm's
        generate feeds it: one query reads the keys as a decode step does, so a lone request
        computes its first token as mlx-lm does.
        """
        for chunk in group:
            assert chunk.start == chunk.seq.num_computed, "a chunk must continue its sequence"
        heads = [(c.seq, c.start, c.end - 1 if c.is_last else c.end) for c in group]
        self._run([(seq, start, end) for seq, start, end in heads if end > start])
        for chunk in group:
            chunk.seq.num_computed = chunk.end
        tails = [(c.seq, c.end - 1, c.end) for c in group if c.is_last]
        return self._run(tails) if tails else None

    def _run(self, parts: list[tuple[Sequence, int, int]]) -> mx.array | None:
        """One left-padded forward of each ``(seq, start, end)`` token range; the logits of
        each row's last token."""
        if not parts:
            return None
        new = [end - start for _, start, end in parts]
        width = max(new)
        rows = [[0] * (width - n) + seq.prefill_ids[start:end]
                for (seq, start, end), n in zip(parts, new, strict=True)]  # fmt: skip
        tables = [seq.block_ids for seq, _, _ in parts]
        step = PagedStep.build(tables, [start for _, start, _ in parts], new, self.pool)
        logits: mx.array = self.model(mx.array(rows), cache=PagedKVCache.for_step(self.pool, step))
        return logits[:, -1, :]

    def reset(self) -> list[Sequence]:
        self.tail.drop_batch()
        return super().reset()

    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        if self.tail.due():
            # The one pipeline bubble in FLUSH_EVERY (or VIEW_STEP) steps: the pool may be
            # written only once the step in flight is done with it.
            if self._pending is not None:
                mx.eval(self._pending)
            self.tail.flush(self.pool)
        # The scheduler made room (reserve_decode): each row writes its next token at
        # position num_computed, inside its block table.
        caches = decode_caches(self.pool, self.tail, [s.block_ids for s in rows],
                               [s.num_computed for s in rows])  # fmt: skip
        for seq in rows:
            seq.num_computed += 1
        return caches  # type: ignore[return-value]

    def _filter_cache(self, keep: list[int]) -> None:
        # Rows own no K/V but their tail; their blocks go back to the pool through the scheduler.
        self.tail.keep(keep, len(self.rows))


def _pack(chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
    """Group chunks, longest first, so no group pads beyond ``_MAX_PAD_RATIO`` x its tokens."""
    groups: list[list[PrefillChunk]] = []
    real = 0
    for chunk in sorted(chunks, key=lambda c: c.start - c.end):
        n = chunk.end - chunk.start
        if groups and (len(groups[-1]) + 1) * _width(groups[-1]) <= _MAX_PAD_RATIO * (real + n):
            groups[-1].append(chunk)
            real += n
        else:
            groups.append([chunk])
            real = n
    return groups


def _width(group: list[PrefillChunk]) -> int:
    return group[0].end - group[0].start  # the longest: groups are filled longest first
