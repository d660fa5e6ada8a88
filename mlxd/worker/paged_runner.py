"""The model runner on the paged KV cache: every sequence's K/V lives in the block pool.

Prefill chunks (whole prompts, parts of long ones, resumed sequences, suffixes after a prefix
hit) run together in left-padded forwards over their block tables, writing the pool. Decode
steps only read it: their new K/V go to a ``DecodeTail`` that is flushed into the pool before
the next prefill and every few steps, so decode steps pipeline (see ``decode_tail``). Rows join
and leave the batch without copying any K/V: only block tables change, and the scheduler owns
those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxd.worker import attention_shapes, grammar, logprobs, verification
from mlxd.worker.decode_tail import DecodeTail, decode_caches, verify_caches
from mlxd.worker.kv_format import parts
from mlxd.worker.model_runner import ModelRunner, TokenEvent
from mlxd.worker.output_head import all_positions
from mlxd.worker.paged_cache import KVPool, PagedKVCache, PagedStep
from mlxd.worker.sampling import sample
from mlxd.worker.scheduler import PrefillChunk
from mlxd.worker.sequence import Sequence

# A prefill group may pad to at most this many times its real tokens (else it splits).
_MAX_PAD_RATIO = 2
# Verification as one single-query row per input (``_forward_as_rows``) where multi-query
# attention builds a plan per shape (CUDA: ``attention_shapes``), else one left-padded window per
# row, the path measured on the CPU (docs/PERFORMANCE.md). Both run in the tests.
VIRTUAL_ROWS = attention_shapes.PLANNED
# A lone row decoding through a read view verifies on it (``_forward_on_view``); off only to
# measure the other paths (``scripts/spec_trace.py``'s ``/gather`` modes).
VIEW_VERIFY = True
# ... and its verifications pipeline (``_launch``): off only to measure (``/serial`` modes).
VERIFY_AHEAD = True
# Verifications launched, landed: (rows, each row's drafts, tokens each kept).
Verified = tuple[list[Sequence], list[list[int]], list[int]]


@dataclass(slots=True)
class _InFlight:
    """A lone row's verification launched and not read yet: its drafts, its samples, and
    (lazy) how many tokens it keeps and the last of them, which the next one is built on."""

    seq: Sequence
    drafts: list[int]
    targets: mx.array
    count: mx.array
    last: mx.array


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
        self.max_view_tokens = pool.num_blocks * pool.block_size if max_view_tokens is None else (
            max_view_tokens)  # fmt: skip
        self.tail = DecodeTail(len(pool.keys), self.max_view_tokens)
        self.gathered_steps = 0
        self.view_verifications = 0  # verifications of one row over decode's view
        self.verifications_ahead = 0  # ... of them launched on one not read yet (``_launch``)
        self._ahead: _InFlight | None = None  # a lone row's verification not read yet
        self._landed: list[TokenEvent] = []  # tokens of one read outside a step, not handed out
        self._verified: list[Verified] = []  # verifications read since ``take_verified``

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
        self._land_ahead()  # its tokens go into the view before the flush below
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
        return self._take_landed()

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
        return (f"paged: up to {p.num_blocks} blocks of {p.block_size} {bits}tokens "
                f"({p.num_blocks * p.bytes_per_block / 2**30:.2f} GiB; {p.capacity} held, "
                f"grown {p.chunk_blocks} or more at a time), decode view up to "
                f"{self.max_view_tokens} tokens ({self._view_bytes / 2**30:.2f} GiB)")  # fmt: skip

    def settle(self) -> None:
        """The step in flight done and decode's unflushed tokens in the pool: before the pool
        is read or written between steps (the disk tier, an idle release)."""
        self._land_ahead()
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
        if self._ahead is not None:
            return self._verify_ahead(drafts[0])
        assert self._pending is not None and all(self._emitted), "sync before verifying"
        rows = list(self.rows)
        pending: list[int] = self._pending.tolist()  # type: ignore[assignment]
        inputs = [[p, *d] for p, d in zip(pending, drafts, strict=True)]
        on_view = VIEW_VERIFY and len(rows) == 1 and self._view_room(rows[0], len(inputs[0]))
        if on_view and self._pipelines(rows[0]):
            self._ahead = self._launch(rows[0], mx.array(pending, dtype=mx.uint32), drafts[0])
            return self._take_landed()
        if on_view:
            flat = self._forward_on_view(rows[0], inputs[0])
        else:
            self.tail.flush(self.pool)
            self.tail.restart()
            forward = self._forward_as_rows if VIRTUAL_ROWS else self._forward_as_windows
            flat = forward(rows, inputs)
        seqs = [s for s, x in zip(rows, inputs, strict=True) for _ in x]
        sample_rows = [self._sample_row(s, emitted=True, ahead=j)
                       for s, x in zip(rows, inputs, strict=True)
                       for j in range(len(x))]  # fmt: skip
        constrained = grammar.constrain_drafts(flat, list(zip(rows, drafts, strict=True)))
        targets = sample(constrained, sample_rows)
        lp = logprobs.compute(flat, targets, seqs)
        kept = verification.accept(inputs, targets.tolist())  # type: ignore[arg-type]
        if on_view:
            self._record_on_view(rows[0], len(kept[0]))
        self._verified.append((rows, drafts, [len(k) for k in kept]))
        return self._take_landed() + self._keep(rows, inputs, kept, seqs, lp)

    def verifying_ahead(self) -> list[int] | None:
        """The drafts of the lone row's verification in flight, when the next one may be
        built on it (its tokens unread: ``_launch``); else None (the engine reads it first)."""
        ahead = self._ahead
        if ahead is None or self._landed or len(self.rows) != 1 or self.rows[0] is not ahead.seq:
            return None
        return ahead.drafts if self._pipelines(ahead.seq) else None

    def take_verified(self) -> list[Verified]:
        """The verifications read since the last call (each row's drafts and kept count)."""
        out, self._verified = self._verified, []
        return out

    def ahead_of(self, seq: Sequence) -> int:
        """Positions after ``seq``'s computed ones that its verification in flight writes."""
        ahead = self._ahead
        return len(ahead.drafts) + 1 if ahead is not None and ahead.seq is seq else 0

    def needs_sync(self) -> bool:
        return self._ahead is not None or bool(self._landed) or super().needs_sync()

    def sync(self) -> list[TokenEvent]:
        self._land_ahead()
        return self._take_landed() + super().sync()

    def decode_step(self) -> list[TokenEvent]:
        self._land_ahead()  # the engine syncs first; a plain step needs the row's last token
        landed = self._take_landed()
        return landed + super().decode_step()

    def remove(self, seqs: set[Sequence]) -> None:
        if self._ahead is not None and self._ahead.seq in seqs:
            self._ahead = None  # its row is done (or preempted: computed again from its tokens)
        super().remove(seqs)

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
        logits = self.model(mx.array(inputs)[:, None], cache=caches)
        return logits.reshape(-1, logits.shape[-1])

    def _pipelines(self, seq: Sequence) -> bool:
        """Whether ``seq``'s verifications may pipeline: alone on decode's view, greedy, no
        grammar or logprobs (whose host work needs the tokens before), ``min_tokens`` past."""
        p = seq.sampling
        return (VERIFY_AHEAD and VIEW_VERIFY and self.tail.view and seq.grammar is None
                and not p.logprobs and p.temperature == 0.0
                and seq.num_output_tokens >= p.min_tokens)  # fmt: skip

    def _launch(self, seq: Sequence, first: mx.array, drafts: list[int],
                before: _InFlight | None = None) -> _InFlight:  # fmt: skip
        """Start a verification of ``seq``'s next input ``first`` (``(1,)``, maybe lazy) and
        ``drafts`` on decode's view, without reading it: its samples, and how many tokens it
        keeps, stay on the device until ``_land``. ``before``: the verification still running
        whose kept tokens ``first`` follows (its count places this one's inputs).

        Why: a verification's host work (about 3 ms of graph building on an H100 for SmolLM2,
        against 4 ms for a whole plain step) cannot overlap its own device work, since its
        drafts follow from the tokens it reads. Built on the one before (assuming its drafts
        are kept: the engine drafts after them), it overlaps that one's device work as a plain
        step does; when the one before keeps fewer, this one's input is still the right token
        at the right position (both on the device), and only its drafts, made for another
        context, are likely wrong."""
        n = 1 + len(drafts)
        shift, spare = (None, 0) if before is None else (before.count, len(before.drafts) + 1)
        caches = verify_caches(self.pool, self.tail, seq.block_ids, seq.num_computed, n, shift,
                               spare)  # fmt: skip
        tokens = mx.concatenate([first.astype(mx.uint32), mx.array(drafts, dtype=mx.uint32)])
        logits = self.model(tokens[:, None], cache=caches)
        flat = logits.reshape(-1, logits.shape[-1])
        targets = sample(flat, [self._sample_row(seq, emitted=True, ahead=j) for j in range(n)])
        count, last = verification.kept_on_device(targets, drafts)
        mx.async_eval(targets, count, last)
        self.view_verifications += 1
        self.verifications_ahead += before is not None
        return _InFlight(seq, drafts, targets, count, last.reshape(1))

    def _verify_ahead(self, drafts: list[int]) -> list[TokenEvent]:
        """Launch the lone row's next verification on the one in flight, then read that one.
        Without room in the view for both, read it first and verify as before."""
        before = self._ahead
        assert before is not None
        spare = len(before.drafts) + 1
        if not self.tail.room(spare + 1 + len(drafts)):
            events = self._land(before)
            return events + self.verify_step([drafts])
        self._ahead = self._launch(before.seq, before.last, drafts, before)
        return self._take_landed() + self._land(before)

    def _land(self, ahead: _InFlight) -> list[TokenEvent]:
        """Read a launched verification (``_launch``): its kept tokens become the row's."""
        if self._ahead is ahead:
            self._ahead = None
        seq, inputs = ahead.seq, [[-1, *ahead.drafts]]  # its first input was read before
        kept = verification.accept(inputs, ahead.targets.tolist())  # type: ignore[arg-type]
        self._record_on_view(seq, len(kept[0]))
        self._verified.append(([seq], [ahead.drafts], [len(kept[0])]))
        return self._keep([seq], inputs, kept, [seq] * len(inputs[0]), None)

    def _land_ahead(self) -> None:
        """Read the verification in flight, if any; its tokens wait in ``_landed``."""
        if self._ahead is not None:
            self._landed += self._land(self._ahead)

    def _take_landed(self) -> list[TokenEvent]:
        out, self._landed = self._landed, []
        return out

    def _record_on_view(self, seq: Sequence, kept: int) -> None:
        """The view's columns of the first ``kept`` inputs (the ones before each kept token)
        are decoded tokens now; the pool slots they belong in, for the next flush."""
        bs, n, table = self.pool.block_size, seq.num_computed, seq.block_ids
        slots = [table[p // bs] * bs + p % bs for p in range(n, n + kept)]
        self.tail.append_slots(mx.array([slots]))

    def _forward_as_windows(self, rows: list[Sequence], inputs: list[list[int]]) -> mx.array:
        """The target's logits after each input, ``(sum of inputs, vocab)``, row by row: each
        row's inputs in one left-padded window of queries."""
        step = PagedStep.build([s.block_ids for s in rows], [s.num_computed for s in rows],
                               [len(x) for x in inputs], self.pool)  # fmt: skip
        with all_positions(self.model):
            logits = self.model(verification.window(inputs),
                                cache=PagedKVCache.for_step(self.pool, step))  # fmt: skip
        return logits.reshape(-1, logits.shape[-1])[verification.real_positions(inputs)]

    def _forward_as_rows(self, rows: list[Sequence], inputs: list[list[int]]) -> mx.array:
        """As ``_forward_as_windows``, but every input is a row of its own with one query
        (position ``num_computed + j``, its sequence's block table), so attention runs as in
        decode, whatever the draft lengths. The K/V of every input is written before any is
        read, layer by layer, so input ``j`` sees the ones before it."""
        tables, positions, tokens = [], [], []
        for seq, x in zip(rows, inputs, strict=True):
            for j, token in enumerate(x):
                tables.append(seq.block_ids)
                positions.append(seq.num_computed + j)
                tokens.append(token)
        step = PagedStep.build(tables, positions, [1] * len(tokens), self.pool)
        logits = self.model(mx.array(tokens)[:, None], cache=PagedKVCache.for_step(self.pool, step))
        return logits.reshape(-1, logits.shape[-1])

    def _keep(
        self, rows: list[Sequence], inputs: list[list[int]], kept: list[list[int]],
        seqs: list[Sequence], lp: logprobs.StepLogprobs | None,
    ) -> list[TokenEvent]:  # fmt: skip
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
        rows = [[0] * (width - n) + seq.prefill_ids[start:end]
                for (seq, start, end), n in zip(parts, new, strict=True)]  # fmt: skip
        caches = self._step_caches([s for s, _, _ in parts], [start for _, start, _ in parts], new)
        self.model(mx.array(rows), cache=caches)

    def _step_caches(self, seqs: list[Sequence], starts: list[int], new: list[int],
                     exact: bool = False) -> list[Any]:  # fmt: skip
        """The caches of a forward of ``new[b]`` tokens after ``starts[b]`` for each of
        ``seqs`` (``PagedStep.build``)."""
        step = PagedStep.build([s.block_ids for s in seqs], starts, new, self.pool, exact)
        return PagedKVCache.for_step(self.pool, step)  # type: ignore[return-value]

    def _kv(self) -> list[tuple[KVPool, DecodeTail]]:
        """Each pool with its decode tail (a windowed model has two: ``window_runner``)."""
        return [(self.pool, self.tail)]

    def _flush(self) -> None:
        for pool, tail in self._kv():
            tail.flush(pool)

    def reset(self) -> list[Sequence]:
        self._ahead, self._landed = None, []
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
        return decode_caches(self.pool, self.tail, [s.block_ids for s in rows],  # type: ignore[return-value]
                             [s.num_computed for s in rows])  # fmt: skip

    def _filter_cache(self, keep: list[int]) -> None:
        # Rows own no K/V but their tail; their blocks go back to the pool through the scheduler.
        for _, tail in self._kv():
            tail.keep(keep, len(self.rows))


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
