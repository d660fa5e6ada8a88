"""Admission and batching policy: which sequences prefill next, which decode, which wait.

With a ``BlockPool`` the scheduler asks its ``KVLedger`` (kv_ledger.py) for KV memory: a
sequence is admitted only when the blocks of its prompt fit (after reusing cached prefix blocks
and evicting unreferenced ones), and when decode needs a block the ledger cannot find, the
scheduler preempts the lowest-priority, most recent sequence, which waits again and later
recomputes its prompt and output so far.

Embeddings requests share the prompts' token budget per step (``prefill_chunk``): they wait in
the same priority order, and a large one runs a budget of inputs per step between decode steps
instead of stalling every running stream for its whole length; an input longer than the budget
runs in prompt-sized pieces over several steps.

Pure Python on ints: no MLX here, so the policy is cheap to import and to unit-test.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from mlxd.config import SchedulerConfig
from mlxd.errors import Overloaded
from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.kv.window_slabs import WindowSlabs
from mlxd.worker.prefix.radix_cache import RadixCache
from mlxd.worker.sched import image_spans
from mlxd.worker.sched.drain_rate import DrainRate
from mlxd.worker.sched.embed_job import EmbedJob
from mlxd.worker.sched.kv_ledger import KVLedger
from mlxd.worker.sched.prefill_cost import PrefillCost
from mlxd.worker.sched.sequence import Sequence, SequenceStatus
from mlxd.worker.stats import KVReport


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Prompt tokens ``[start, end)`` of ``seq`` go through the model in this step."""

    seq: Sequence
    start: int
    end: int

    @property
    def is_last(self) -> bool:
        return self.end >= self.seq.num_prefill_tokens

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class EmbedChunk:
    """Inputs ``job.order[start:end]`` of ``job`` are embedded in this step, in one batch; or,
    with ``piece``, tokens ``[piece[0], piece[1])`` of the one input ``job.order[start]``, which
    is longer than a step's budget and is embedded a prompt chunk at a time."""

    job: EmbedJob
    start: int
    end: int
    piece: tuple[int, int] | None = None

    @property
    def is_last(self) -> bool:
        return self.end >= self.job.num_inputs and self.ends_input

    @property
    def ends_input(self) -> bool:
        """The chunk's inputs are whole after it (a piece: it is its input's last)."""
        return self.piece is None or self.piece[1] >= self.job.length(self.start)

    @property
    def input_indices(self) -> list[int]:
        return self.job.order[self.start : self.end]

    @property
    def num_tokens(self) -> int:
        """Padded tokens: every input of the batch costs the longest (the last, shortest first)."""
        if self.piece is not None:
            return self.piece[1] - self.piece[0]
        return self.job.length(self.end - 1) * (self.end - self.start)


@dataclass(slots=True)
class CacheCounters:
    """Prefix-cache and preemption counts since the worker started."""

    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    preemptions: int = 0


MIN_CHUNK = 16  # tokens: a shorter prompt chunk costs a step's overhead for almost nothing
MAX_SHRINK = 4  # a chunk sized by cost keeps 1/4 of the budget: a long prompt's steps stay few


class Scheduler:
    """Keeps the waiting queue (priority with aging), the prefilling and the running sequences."""

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Callable[[], float] = time.monotonic,
        pool: BlockPool | None = None,
        cost: PrefillCost | None = None,
    ) -> None:
        self.config = config
        # what a chunk costs the streams that wait on it (prefill_cost.py)
        self.cost = cost or PrefillCost()
        self.clock = clock
        # KV memory: blocks, prefix cache, window slabs; None: the contiguous cache, no accounts
        self.kv = KVLedger(pool) if pool is not None else None
        # Rows whose chunks one step's budget buys while no stream decodes: a hybrid's prefill
        # costs about its longest row's tokens, not their sum (its recurrent layers scan tokens
        # in order, all rows at once), so each of up to this many gets a whole ``prefill_chunk``.
        self.prefill_rows = 1
        self.counters = CacheCounters()
        self.drain = DrainRate()  # departures from ``waiting``: the 429's Retry-After
        self.waiting: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.embedding: list[EmbedJob] = []  # embeddings requests with inputs left to schedule

    # Public API

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; raise ``Overloaded`` when the waiting queue is full."""
        self._check_queue_room()
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_embed(self, job: EmbedJob) -> None:
        """Queue an embeddings request; ``Overloaded`` as for ``add`` (they share the queue)."""
        self._check_queue_room()
        self.embedding.append(job)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running or self.embedding)

    def schedule_prefill(self, admit: bool = True) -> list[PrefillChunk | EmbedChunk]:
        """The work to run before this step's decode: at most ``prefill_chunk`` tokens in all.

        Sequences already prefilling continue first, so a long prompt finishes before new ones
        start. Then queued requests by effective priority: a waiting sequence is admitted while
        batch slots remain (and ``admit``: the runner has room for one more); an embeddings
        request gets its next inputs, shortest first, as many as fit padded; an input longer than a
        whole step's budget goes a prompt chunk at a time, as a prompt of its length would. While
        streams run, prompt chunks spend the budget as cost (``PrefillCost``): deep in a long
        prompt they are shorter, so the streams' next token waits no longer there.
        """
        # several rows' chunks only while no stream waits on the step (they may not batch)
        budget = self.config.prefill_chunk * (1 if self.running else self.prefill_rows)
        chunks: list[PrefillChunk | EmbedChunk] = []
        stalled = False  # a prompt found no window slab free for its chunk (``_window_room``)
        for seq in list(self.prefilling):
            if budget <= 0:
                return chunks
            part = self._chunk(seq, budget)
            if part.num_tokens == 0 and seq.num_prefilled < seq.num_prefill_tokens:
                stalled = True
                continue
            chunks.append(part)
            budget -= self._spent(chunks[-1])
        if stalled:  # admit none before it; if nothing else runs either, start it over
            if not chunks and not self.running:
                self._preempt(self._victim(), cache=False)
                if self.kv is not None:
                    self.kv.start_over()
            return chunks
        while budget > 0:
            chunk = self._next_queued_chunk(admit, budget)
            if chunk is None:
                break
            budget -= self._spent(chunk)
            chunks.append(chunk)
        return chunks

    def complete_chunk(self, chunk: PrefillChunk) -> None:
        """Record that ``chunk`` ran; a fully prefilled sequence joins the decode batch."""
        seq = chunk.seq
        seq.num_prefilled = chunk.end
        if self.kv is not None:
            self.kv.index_chunk(seq, chunk.is_last)
        if chunk.is_last and seq in self.prefilling:
            self.prefilling.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if self.kv is not None:
                self.kv.index_prompt(seq)
            elif not seq.num_preemptions:  # the runner's own prefix cache set num_cached
                self._count_lookup(seq.num_cached)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of every queue, free its blocks, mark it finished with ``reason``."""
        if seq in self.waiting:
            self.drain.observe(self.clock())  # a cancelled waiter frees its place too
        for queue in (self.waiting, self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        if self.kv is not None:
            self.kv.free(seq, cache=reason != "error")
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def requeue(self, seq: Sequence) -> None:
        """Queue ``seq`` again to recompute its prompt and output so far, keeping none of its
        blocks: the step that failed may have left their K/V incomplete."""
        self._preempt(seq, cache=False)

    def reserve_decode(self, rows: list[Sequence]) -> list[Sequence]:
        """Give every row room for the token its next decode step writes, preempting sequences
        when the pool is out of blocks. Returns the preempted sequences (they wait again)."""
        if self.kv is None:
            return []
        preempted: list[Sequence] = []
        self.kv.drop_behind(rows)
        for seq in rows:
            if seq in preempted:
                continue
            while not self.kv.grow(seq):
                victim = self._victim()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        return preempted

    def reserve_drafts(self, seq: Sequence, num_drafts: int) -> int:
        """Room for ``seq``'s next token (reserved already) and up to ``num_drafts`` draft tokens
        after it, from free blocks only: a draft never evicts a cached prefix or preempts
        anyone. Returns how many drafts fit."""
        return num_drafts if self.kv is None else self.kv.reserve_drafts(seq, num_drafts)

    def trim(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks past its computed tokens (those of rejected drafts). They
        never held an accepted token, so the prefix cache never indexed them."""
        if self.kv is not None:
            self.kv.trim(seq)

    def preempt_one(self) -> Sequence | None:
        """Preempt the lowest-priority, most recent sequence (the runner is out of room);
        returns it (None: nothing runs, e.g. every row just finished)."""
        if not self.running and not self.prefilling:
            return None
        victim = self._victim()
        self._preempt(victim)
        return victim

    def flush_prefix_cache(self) -> int:
        """Drop every cached block no running sequence uses; returns how many were freed."""
        return self.kv.flush() if self.kv is not None else 0

    def find_embed(self, request_id: str, client: bytes) -> EmbedJob | None:
        for job in self.embedding:
            if job.request_id == request_id and job.client == client:
                return job
        return None

    def drop_embed(self, job: EmbedJob) -> None:
        """Forget the inputs of ``job`` not scheduled yet (cancelled, or it failed)."""
        if job in self.embedding:
            self.embedding.remove(job)
            self.drain.observe(self.clock())

    def find(self, request_id: str, client: bytes) -> Sequence | None:
        for queue in (self.waiting, self.prefilling, self.running):
            for seq in queue:
                if seq.request_id == request_id and seq.client == client:
                    return seq
        return None

    def expired(self) -> list[Sequence]:
        """Sequences whose deadline has passed."""
        now = self.clock()
        return [
            s
            for q in (self.waiting, self.prefilling, self.running)
            for s in q
            if s.deadline is not None and s.deadline <= now
        ]

    def effective_priority(self, item: Sequence | EmbedJob, now: float) -> float:
        """Lower runs first: the priority level, improved by one level per ``aging_s`` waited."""
        return item.priority - (now - item.arrival) / self.config.aging_s

    def update_config(self, **changes: object) -> None:
        """Apply new limits live (validated by SchedulerConfig)."""
        self.config = replace(self.config, **changes)  # type: ignore[arg-type]

    def num_live_blocks(self) -> int:
        """Distinct blocks that sequences in flight hold (shared prefix blocks count once)."""
        return len({b for q in (self.prefilling, self.running) for s in q for b in s.block_ids})

    def kv_report(self) -> KVReport:
        c = self.counters
        counts = KVReport(
            preemptions=c.preemptions, hits=c.hits, misses=c.misses, hit_tokens=c.hit_tokens
        )
        # without a pool, hits of the runner's snapshots, if any
        return counts if self.kv is None else self.kv.report(counts)

    def check_invariants(self) -> None:
        """The ledger's invariants: pool, prefix cache, every live block accounted for."""
        if self.kv is not None:
            self.kv.check_invariants(self.prefilling + self.running, self.waiting)

    # The ledger's parts, as the engine, the idle release, the builder and tests read them

    @property
    def pool(self) -> BlockPool | None:
        """The block pool (None: the contiguous cache)."""
        return None if self.kv is None else self.kv.pool

    @property
    def radix(self) -> RadixCache | None:
        """The prefix cache over the pool (None without one)."""
        return None if self.kv is None else self.kv.radix

    @property
    def windows(self) -> WindowSlabs | None:
        """A sliding-window model's slabs (``KVLedger.keep_windows``)."""
        return None if self.kv is None else self.kv.windows

    @windows.setter
    def windows(self, windows: WindowSlabs | None) -> None:
        assert self.kv is not None, "window slabs need a block pool"
        self.kv.windows = windows

    @property
    def reclaim(self) -> Callable[[], bool] | None:
        """What shrinks the runner's arrays when out of room (``KVLedger.reclaim``)."""
        return None if self.kv is None else self.kv.reclaim

    @reclaim.setter
    def reclaim(self, reclaim: Callable[[], bool] | None) -> None:
        assert self.kv is not None, "reclaim needs a block pool"
        self.kv.reclaim = reclaim

    # Internal helpers

    def _check_queue_room(self) -> None:
        num_queued = len(self.waiting) + len(self.embedding)
        if num_queued >= self.config.max_queued:
            raise Overloaded(
                f"the queue is full ({self.config.max_queued} waiting requests); retry later",
                retry_after=self.drain.retry_after(num_queued, self.clock()),
            )

    def _next_queued_chunk(self, admit: bool, budget: int) -> PrefillChunk | EmbedChunk | None:
        """The best queued request's work within ``budget``; None when nothing queued may start
        or the best must wait (then nothing jumps ahead of it)."""
        best = self._best_queued(admit)
        if isinstance(best, EmbedJob):
            return self._embed_chunk(best, min(budget, self.config.prefill_chunk))
        if best is None or (
            self.kv is not None and self.kv.prefix_in_flight(best, self.prefilling)
        ):
            return None  # next step its prefix is cached: reuse it rather than compute it twice
        if not self._allocate_prompt(best):
            return None  # the best waiting request does not fit yet
        self.waiting.remove(best)
        self.drain.observe(self.clock())
        self.prefilling.append(best)
        return self._chunk(best, budget)

    def _best_queued(self, admit: bool) -> Sequence | EmbedJob | None:
        queued: list[Sequence | EmbedJob] = list(self.embedding)
        if admit and self._num_slots_used() < self.config.max_num_seqs:
            queued += self.waiting
        if not queued:
            return None
        now = self.clock()
        return min(queued, key=lambda q: (self.effective_priority(q, now), q.arrival))

    def _embed_chunk(self, job: EmbedJob, budget: int) -> EmbedChunk | None:
        """``job``'s next inputs whose padded batch fits ``budget`` (None if not even one does);
        an input longer than a whole step's budget goes a piece at a time (``_embed_piece``)."""
        start = end = job.num_scheduled
        if job.offset or job.length(start) > self.config.prefill_chunk:
            return self._embed_piece(job, budget)
        while end < job.num_inputs and job.length(end) * (end + 1 - start) <= budget:
            end += 1
        if end == start:
            return None
        job.num_scheduled = end
        return self._scheduled(EmbedChunk(job, start, end))

    def _embed_piece(self, job: EmbedJob, budget: int) -> EmbedChunk | None:
        """The next piece of ``job``'s long input: as many tokens as a prompt chunk at that
        position gets (its cost, while streams run), so a long input stalls the streams no
        longer than a prompt of its length does (issue 41 point 6)."""
        start, first, length = job.num_scheduled, job.offset, job.length(job.num_scheduled)
        last = min(length, first + self._span(first, budget))
        if last - first < min(MIN_CHUNK, length - first):
            return None  # what the step has left buys too little: the next step
        job.offset = 0 if last >= length else last
        job.num_scheduled += last >= length
        return self._scheduled(EmbedChunk(job, start, start + 1, (first, last)))

    def _scheduled(self, chunk: EmbedChunk) -> EmbedChunk:
        if chunk.is_last:  # every input is scheduled: the engine answers after this step
            self.drop_embed(chunk.job)
        return chunk

    def _num_slots_used(self) -> int:
        return len(self.running) + len(self.prefilling)

    def _chunk(self, seq: Sequence, budget: int) -> PrefillChunk:
        start = seq.num_prefilled
        end = min(seq.num_prefill_tokens, start + self._span(start, budget))
        end = image_spans.chunk_end(seq.image_spans, start, end)  # each image in one forward
        if self.kv is not None:  # a windowed model's slabs may cover less
            end = image_spans.shrunk_end(seq.image_spans, start, self.kv.window_room(seq, end))
        return PrefillChunk(seq, start, max(start, end))

    def _span(self, start: int, budget: int) -> int:
        """Tokens from position ``start`` that a prompt chunk gets of ``budget``."""
        budget = min(budget, self.config.prefill_chunk)  # a row's share (``prefill_rows``)
        if self.running:  # streams wait on this step: a chunk within the budget's cost
            floor = min(budget, max(MIN_CHUNK, self.config.prefill_chunk // MAX_SHRINK))
            budget = max(floor, self.cost.tokens_within(budget, start))
        return budget

    def _spent(self, chunk: PrefillChunk | EmbedChunk) -> int:
        if isinstance(chunk, EmbedChunk):
            if chunk.piece is None or not self.running:
                return chunk.num_tokens
            return math.ceil(self.cost.of(chunk.piece[0], chunk.num_tokens))
        if not self.running:
            return chunk.num_tokens
        return math.ceil(self.cost.of(chunk.start, chunk.num_tokens))

    def _allocate_prompt(self, seq: Sequence) -> bool:
        """Blocks for ``seq``'s prompt (``KVLedger.admit``), its prefix-cache lookup counted."""
        if self.kv is None:
            return True
        alone = not self.running and not self.prefilling
        if not self.kv.admit(seq, self.config.prefill_chunk, self.waiting, alone):
            return False
        if not seq.num_preemptions:  # a resumed sequence's own blocks are not a cache hit
            self._count_lookup(seq.num_cached)
        return True

    def _count_lookup(self, num_cached: int) -> None:
        self.counters.hits += bool(num_cached)
        self.counters.misses += not num_cached
        self.counters.hit_tokens += num_cached

    def _victim(self) -> Sequence:
        """Whom to preempt among the sequences in flight (``KVLedger.victim``)."""
        return KVLedger.victim(self.running + self.prefilling)

    def _preempt(self, seq: Sequence, cache: bool = True) -> None:
        """Free ``seq``'s blocks and queue it again to recompute its prompt and output so far."""
        for queue in (self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        if self.kv is not None:
            self.kv.free(seq, cache=cache)
        seq.num_resumed = seq.num_output_tokens
        seq.num_prefilled = 0
        seq.num_preemptions += 1
        self.counters.preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
