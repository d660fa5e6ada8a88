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

from mlxd.worker.kv import attention_shapes, layer_caches
from mlxd.worker.kv.decode_tail import DecodeTail, decode_caches, verify_caches
from mlxd.worker.kv.formats import parts
from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep
from mlxd.worker.runners.base import ModelRunner, TokenEvent
from mlxd.worker.runners.output_head import all_positions
from mlxd.worker.sampling import grammar, logprobs
from mlxd.worker.sampling.sampling import sample
from mlxd.worker.sched.scheduler import PrefillChunk
from mlxd.worker.sched.sequence import Sequence
from mlxd.worker.spec import verification

# A prefill group may pad to at most this many times its real tokens (else it splits).
_MAX_PAD_RATIO = 2
# Verification as one single-query row per input (``_forward_as_rows``) where multi-query
# attention builds a plan per shape (CUDA: ``attention_shapes``), else one left-padded window per
# row, the path measured on the CPU (docs/PERFORMANCE.md). Both run in the tests.
VIRTUAL_ROWS = attention_shapes.PLANNED
# A lone row decoding through a read view verifies on it (``_forward_on_view``); off only to
# measure the other paths (``bench/spec_trace.py``'s ``/gather`` modes).
VIEW_VERIFY = True


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


class PagedModelRunner(ModelRunner):
    """``ModelRunner`` whose caches are views of a ``KVPool`` through each row's block table."""

    speculates = True  # ``verify_step``: drafts are scored over the rows' block tables

    def __init__(
        self, model: Any, eos_token_ids: set[int], pool: KVPool, max_view_tokens: int | None = None
    ) -> None:
        """``max_view_tokens``: rows x columns decode's read view may hold (see ``decode_tail``);
        by default as many tokens as the pool."""
        super().__init__(model, eos_token_ids)
        self.pool = pool
        self.max_view_tokens = (
            pool.num_blocks * pool.block_size if max_view_tokens is None else (max_view_tokens)
        )
        self.tail = DecodeTail(len(pool.keys), self.max_view_tokens)
        self.gathered_steps = 0
        self.view_verifications = 0  # verifications of one row over decode's view

    # Public API

    def prefill(self, chunks: list[PrefillChunk]) -> list[TokenEvent]:
        """Run this step's chunks but the last token of each prompt they finish; those rows join
        the decode batch with that token as their next input.

        So a prompt's last token runs in a decode step, as mlx-lm feeds it (its generate and its
        batch generator alike): a lone request computes its first token as mlx-lm does, and a
        batched one as it would alone. (On an H100 in float16, taking it from the prefill
        forward changed a greedy answer at a near-tie: docs/PERFORMANCE.md, fidelity.) It costs
        no forward of its own: the token rides in the decode step the batch runs anyway.
        Returns no tokens: the first ones come from that step.
        """
        if self._pending is not None:
            mx.eval(self._pending)  # a decode step in flight holds the pool: writes would copy it
        # Prefill reads the pool (prefix hits) and must see it all; the flush also completes
        # the last prefill's writes, so these go on top of evaluated arrays.
        self._flush()
        joined: list[Sequence] = []
        for group in self._groups(chunks):
            self._forward(group)
            done = [c.seq for c in group if c.is_last]
            if not done:
                mx.eval([pool.arrays for pool, _ in self._kv()])  # the graph one chunk deep
            joined += done
        if joined:
            for _, tail in self._kv():  # new rows' tokens are in the pool only: the next step
                tail.restart()  # starts there
            self._enter(joined)
        return []

    @property
    def kv_bytes(self) -> int:
        """The pool's arrays as they stand, and decode's view or buffers (their graph may be
        unevaluated: then the size they will have): the KV memory reserved now."""
        held = 0
        for pool, tail in self._kv():
            buffers = [p for b in tail.keys + tail.values if b is not None for p in parts(b)]
            held += pool.nbytes + sum(p.nbytes for p in buffers)
        return held

    @property
    def kv_reserved_bytes(self) -> int:
        return self.kv_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """The most the pool and decode's view may hold together."""
        p = self.pool
        return (p.num_blocks + 1) * p.bytes_per_block + self._view_bytes

    @property
    def kv_description(self) -> str:
        p = self.pool
        bits = f"{p.fmt.bits}-bit " if p.fmt.quantized else ""
        return (
            f"paged: up to {p.num_blocks} blocks of {p.block_size} {bits}tokens "
            f"({p.num_blocks * p.bytes_per_block / 2**30:.2f} GiB; {p.capacity} held, "
            f"grown {p.chunk_blocks} or more at a time), decode view up to "
            f"{self.max_view_tokens} tokens ({self._view_bytes / 2**30:.2f} GiB)"
        )

    def settle(self) -> None:
        """The step in flight done and decode's unflushed tokens in the pool: before the pool
        is read or written between steps (the disk tier, an idle release)."""
        if self._pending is not None:
            mx.eval(self._pending)
        self._flush()

    def release_memory(self, highest_used: int) -> int:
        """Idle: write what decode left into the pool, drop the pool's chunks above block
        ``highest_used`` and free MLX's buffer cache. Returns the blocks dropped."""
        self.settle()
        if not self.rows:
            for _, tail in self._kv():
                tail.drop_batch()
        dropped = self.pool.shrink(highest_used)
        self.free_memory()
        return dropped

    @property
    def _view_bytes(self) -> int:
        return self.max_view_tokens * self.pool.bytes_per_block // self.pool.block_size

    def verify_step(self, drafts: list[list[int]]) -> list[TokenEvent]:
        """One forward over every row's next input and its ``drafts`` (as many as the scheduler
        made room for; ``[]`` for a row that does not speculate), each row keeping the drafts
        its own samples agree with and the sample after them (``verification``). Returns
        those tokens, in order; the last of each row is its next input.

        Every token must have been read (``sync``): drafts follow from it. A lone row decoding
        through a view verifies on it (``_forward_on_view``). Otherwise the forward writes the
        pool through the block tables, as a prefill does, so the decode tail is flushed first
        and the next plain step gathers its view again. Rejected drafts' K/V stay in slots (or
        view columns) past ``num_computed``, which nothing reads and the next tokens overwrite.
        """
        assert self._pending is not None and all(self._emitted), "sync before verifying"
        rows = list(self.rows)
        pending: list[int] = self._pending.tolist()  # type: ignore[assignment]
        inputs = [[p, *d] for p, d in zip(pending, drafts, strict=True)]
        on_view = VIEW_VERIFY and len(rows) == 1 and self._view_room(rows[0], len(inputs[0]))
        if on_view:
            flat = self._forward_on_view(rows[0], inputs[0])
        else:
            self.tail.flush(self.pool)
            self.tail.restart()
            forward = self._forward_as_rows if VIRTUAL_ROWS else self._forward_as_windows
            flat = forward(rows, inputs)
        seqs = [s for s, x in zip(rows, inputs, strict=True) for _ in x]
        sample_rows = [
            self._sample_row(s, emitted=True, ahead=j)
            for s, x in zip(rows, inputs, strict=True)
            for j in range(len(x))
        ]
        constrained = grammar.constrain_drafts(flat, list(zip(rows, drafts, strict=True)))
        targets = sample(constrained, sample_rows)
        lp = logprobs.compute(flat, targets, seqs)
        kept = verification.accept(inputs, targets.tolist())  # type: ignore[arg-type]
        if on_view:
            self._record_on_view(rows[0], len(kept[0]))
        return self._keep(rows, inputs, kept, seqs, lp)

    # Internal helpers

    def _view_room(self, seq: Sequence, columns: int) -> bool:
        """Whether decode's view (started for ``seq`` if no step has yet) takes ``columns``."""
        if not self.tail.started:
            self.tail.start(self.pool, [seq.block_ids], [seq.num_computed])
        return self.tail.room(columns)

    def _forward_on_view(self, seq: Sequence, inputs: list[int]) -> mx.array:
        """One row's logits after each of its inputs, read from and written into decode's view
        (``ViewVerifyCache``): what a verification at one stream costs beyond a decode step is
        its few extra positions, not a flush, a gather of its blocks and a view built again."""
        caches = verify_caches(self.pool, self.tail, seq.block_ids, seq.num_computed, len(inputs))
        self.view_verifications += 1
        extra = self._positions([(seq, [seq.num_computed + j]) for j in range(len(inputs))])
        logits = self.model(mx.array(inputs)[:, None], cache=caches, **extra)
        return logits.reshape(-1, logits.shape[-1])

    def _record_on_view(self, seq: Sequence, kept: int) -> None:
        """The view's columns of the first ``kept`` inputs (the ones before each kept token)
        are decoded tokens now; the pool slots they belong in, for the next flush."""
        bs, n, table = self.pool.block_size, seq.num_computed, seq.block_ids
        slots = [table[p // bs] * bs + p % bs for p in range(n, n + kept)]
        self.tail.append_slots(mx.array([slots]))

    def _forward_as_windows(self, rows: list[Sequence], inputs: list[list[int]]) -> mx.array:
        """The target's logits after each input, ``(sum of inputs, vocab)``, row by row: each
        row's inputs in one left-padded window of queries."""
        step = PagedStep.build(
            [s.block_ids for s in rows],
            [s.num_computed for s in rows],
            [len(x) for x in inputs],
            self.pool,
        )
        window = verification.window(inputs)
        extra = self._positions(
            [
                (s, _padded(s.num_computed, s.num_computed + len(x), window.shape[1]))
                for s, x in zip(rows, inputs, strict=True)
            ]
        )
        with all_positions(self.model):
            logits = self.model(window, cache=PagedKVCache.for_step(self.pool, step), **extra)
        return logits.reshape(-1, logits.shape[-1])[verification.real_positions(inputs)]

    def _forward_as_rows(self, rows: list[Sequence], inputs: list[list[int]]) -> mx.array:
        """As ``_forward_as_windows``, but every input is a row of its own with one query
        (position ``num_computed + j``, its sequence's block table), so attention runs as in
        decode, whatever the draft lengths. The K/V of every input is written before any is
        read, layer by layer, so input ``j`` sees the ones before it."""
        tables, positions, tokens, owners = [], [], [], []
        for seq, x in zip(rows, inputs, strict=True):
            for j, token in enumerate(x):
                tables.append(seq.block_ids)
                positions.append(seq.num_computed + j)
                tokens.append(token)
                owners.append(seq)
        step = PagedStep.build(tables, positions, [1] * len(tokens), self.pool)
        extra = self._positions([(s, [p]) for s, p in zip(owners, positions, strict=True)])
        caches = PagedKVCache.for_step(self.pool, step)
        logits = self.model(mx.array(tokens)[:, None], cache=caches, **extra)
        return logits.reshape(-1, logits.shape[-1])

    def _keep(
        self,
        rows: list[Sequence],
        inputs: list[list[int]],
        kept: list[list[int]],
        seqs: list[Sequence],
        lp: logprobs.StepLogprobs | None,
    ) -> list[TokenEvent]:
        """Advance each row by its kept tokens; the last one is its next input."""
        events: list[TokenEvent] = []
        picks, start = [], 0
        for seq, x, toks in zip(rows, inputs, kept, strict=True):
            seq.num_computed += len(toks)  # its input and the accepted drafts
            events += [(seq, t) for t in toks]
            picks += [(start + j, t) for j, t in enumerate(toks)]
            start += len(x)
        logprobs.attach_positions(lp, seqs, picks)
        grammar.advance(events)
        self._pending = mx.array([toks[-1] for toks in kept], dtype=mx.uint32)
        self._pending_lp = None
        self._emitted = [True] * len(rows)
        self._entering.clear()
        return events

    def _groups(self, chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
        """The chunks that run in one forward (``_pack``)."""
        return _pack(chunks)

    def _forward(self, group: list[PrefillChunk]) -> None:
        """One left-padded forward of ``group``'s chunks, without the last token of a prompt
        (a chunk left with none joins no forward)."""
        parts = []
        for chunk in group:
            assert chunk.start == chunk.seq.num_computed, "a chunk must continue its sequence"
            end = chunk.end - 1 if chunk.is_last else chunk.end
            chunk.seq.num_computed = end
            if end > chunk.start:
                parts.append((chunk.seq, chunk.start, end))
        if not parts:
            return
        new = [end - start for _, start, end in parts]
        width = attention_shapes.queries(max(new))
        rows = [
            [0] * (width - n) + seq.prefill_ids[start:end]
            for (seq, start, end), n in zip(parts, new, strict=True)
        ]
        caches = self._step_caches([s for s, _, _ in parts], [start for _, start, _ in parts], new)
        tokens = mx.array(rows)
        embeds = None if self.vision is None else self.vision.embeddings(tokens, parts)
        extra = self._positions([(s, _padded(a, e, width)) for s, a, e in parts])
        if embeds is None:
            self.model(tokens, cache=caches, **extra)
        else:  # a VLM prompt's images: their features at their placeholders
            extra.update(self.vision.deepstack(width, parts))  # Qwen3-VL's, per layer
            self.model(tokens, cache=caches, input_embeddings=embeds, **extra)

    def _positions(self, rows: list[tuple[Sequence, list[int]]]) -> dict[str, Any]:
        """A Qwen-VL forward's ``position_ids`` (``vision.mrope``) when a row has images,
        each row holding its sequence's given positions (-1: padding); else nothing."""
        mrope = None if self.vision is None else self.vision.mrope
        ids = None if mrope is None else mrope.position_ids(rows)
        return {} if ids is None else {"position_ids": ids}

    def _step_caches(
        self, seqs: list[Sequence], starts: list[int], new: list[int], exact: bool = False
    ) -> list[Any]:
        """The caches of a forward of ``new[b]`` tokens after ``starts[b]`` for each of
        ``seqs`` (``PagedStep.build``)."""
        step = PagedStep.build([s.block_ids for s in seqs], starts, new, self.pool, exact)
        step = with_images(step, seqs, starts, new)
        return PagedKVCache.for_step(self.pool, step)  # type: ignore[return-value]

    def _kv(self) -> list[tuple[KVPool, DecodeTail]]:
        """Each pool with its decode tail (a windowed model has two: ``runners.window``)."""
        return [(self.pool, self.tail)]

    def _flush(self) -> None:
        for pool, tail in self._kv():
            tail.flush(pool)

    def reset(self) -> list[Sequence]:
        for _, tail in self._kv():
            tail.drop_batch()
        return super().reset()

    def _decode_cache(self, rows: list[Sequence]) -> list[Any]:
        if any(tail.due() for _, tail in self._kv()):
            # The one pipeline bubble in FLUSH_EVERY (or VIEW_STEP) steps: the pool may be
            # written only once the step in flight is done with it.
            if self._pending is not None:
                mx.eval(self._pending)
            self._flush()
        # The scheduler made room (reserve_decode): each row writes its next token at
        # position num_computed, inside its block table.
        caches = self._decode_caches(rows)
        self.gathered_steps += self.tail.full
        for seq in rows:
            seq.num_computed += 1
        return caches

    def _decode_caches(self, rows: list[Sequence]) -> list[Any]:
        return decode_caches(
            self.pool,
            self.tail,
            [s.block_ids for s in rows],  # type: ignore[return-value]
            [s.num_computed for s in rows],
        )

    def _filter_cache(self, keep: list[int]) -> None:
        # Rows own no K/V but their tail; their blocks go back to the pool through the scheduler.
        for _, tail in self._kv():
            tail.keep(keep, len(self.rows))


def with_images(
    step: PagedStep, seqs: list[Sequence], starts: list[int], new: list[int]
) -> PagedStep:
    """``step`` (a prefill forward of ``new[b]`` tokens after ``starts[b]`` for each of
    ``seqs``) with the images among them whose tokens attend both ways (``image_spans``)."""
    spans = [
        [(a, e) for a, e in seq.image_spans if a < start + n and e > start]
        for seq, start, n in zip(seqs, starts, new, strict=True)
    ]
    cut = [
        (a, e)
        for s, start, n in zip(spans, starts, new, strict=True)
        for a, e in s
        if a < start or e > start + n
    ]
    assert not cut, f"images {cut} attend both ways but are split across forwards"
    return step.with_spans(spans) if any(spans) else step


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


def _padded(start: int, end: int, width: int) -> list[int]:
    """Positions ``start .. end`` right-aligned in ``width`` columns (-1: left padding)."""
    return [-1] * (width - (end - start)) + list(range(start, end))


def _width(group: list[PrefillChunk]) -> int:
    return group[0].end - group[0].start  # the longest: groups are filled longest first
