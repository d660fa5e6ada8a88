"""Admission and batching policy: which sequences prefill next, which decode, which wait.

With a ``BlockPool`` the scheduler also owns KV memory: a sequence is admitted only when the
blocks of its prompt fit (after reusing cached prefix blocks and evicting unreferenced ones),
and when decode needs a block that is not there it preempts the lowest-priority, most recent
sequence, which waits again and later recomputes its prompt and output so far.

Embeddings requests share the prompts' token budget per step (``prefill_chunk``): they wait in
the same priority order, and a large one runs a budget of inputs per step between decode steps
instead of stalling every running stream for its whole length.

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
from mlxd.worker.sched.drain_rate import DrainRate
from mlxd.worker.sched.embed_job import EmbedJob
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
    """Inputs ``job.order[start:end]`` of ``job`` are embedded in this step, in one batch."""

    job: EmbedJob
    start: int
    end: int

    @property
    def is_last(self) -> bool:
        return self.end >= self.job.num_inputs

    @property
    def input_indices(self) -> list[int]:
        return self.job.order[self.start : self.end]

    @property
    def num_tokens(self) -> int:
        """Padded tokens: every input of the batch costs the longest (the last, shortest first)."""
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
        self.pool = pool  # None: the contiguous cache, no block accounting
        self.radix = RadixCache(pool) if pool is not None else None
        # Rows whose chunks one step's budget buys while no stream decodes: a hybrid's prefill
        # costs about its longest row's tokens, not their sum (its recurrent layers scan tokens
        # in order, all rows at once), so each of up to this many gets a whole ``prefill_chunk``.
        self.prefill_rows = 1
        # A sliding-window model's window layers: their slabs, taken and given back here
        # (window_slabs.py; set with the runner, ``WindowModelRunner.fit_scheduler``).
        self.windows: WindowSlabs | None = None
        # Out of room: the runner's arrays shrink to the ids in use, their budget freed for the
        # other pool's (``WindowModelRunner.reclaim``); None where arrays pay for no budget.
        self.reclaim: Callable[[], bool] | None = None
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
        request gets its next inputs, shortest first, as many as fit padded. Inputs are never
        split, so one longer than a whole step's budget runs alone in a step of its own. While
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
                self._start_over()
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
        if self.windows is not None and self.radix is not None:
            # the blocks computed so far and their slabs, before those behind the window go back
            known = seq.prefill_ids[: seq.num_computed]
            self.radix.insert(known, seq.block_ids, slabs=seq.window_ids)
            self.windows.drop_behind(seq)
        if seq.states and self.radix is not None and not chunk.is_last:
            # a hybrid's snapshots go to the prefix cache as prefill takes them (nothing else
            # bounds them), with the blocks computed so far
            self.radix.insert(seq.prefill_ids[: seq.num_computed], seq.block_ids, seq.states)
            seq.states = {}
        if chunk.is_last and seq in self.prefilling:
            self.prefilling.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if self.radix is not None:  # later requests with this prefix can share it now
                self.radix.insert(seq.prefill_ids, seq.block_ids, seq.states)
                seq.states = {}
            elif not seq.num_preemptions:  # the runner's own prefix cache set num_cached
                self._count_lookup(seq.num_cached)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of every queue, free its blocks, mark it finished with ``reason``."""
        if seq in self.waiting:
            self.drain.observe(self.clock())  # a cancelled waiter frees its place too
        for queue in (self.waiting, self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        self._free_blocks(seq, cache=reason != "error")
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def requeue(self, seq: Sequence) -> None:
        """Queue ``seq`` again to recompute its prompt and output so far, keeping none of its
        blocks: the step that failed may have left their K/V incomplete."""
        self._preempt(seq, cache=False)

    def reserve_decode(self, rows: list[Sequence]) -> list[Sequence]:
        """Give every row room for the token its next decode step writes, preempting sequences
        when the pool is out of blocks. Returns the preempted sequences (they wait again)."""
        if self.pool is None:
            return []
        preempted: list[Sequence] = []
        if self.windows is not None:
            for seq in rows:
                self.windows.drop_behind(seq)
        slabs = int(self.windows is not None)
        for seq in rows:
            if seq in preempted or seq.num_computed < len(seq.block_ids) * self.pool.block_size:
                continue
            while not self._make_room(1, slabs):
                victim = self._victim()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                seq.block_ids += self.pool.allocate(1, keep=self._slab_bytes(1))
                if self.windows is not None:
                    self.windows.grow(seq, seq.num_computed + 1)
        return preempted

    def reserve_drafts(self, seq: Sequence, num_drafts: int) -> int:
        """Room for ``seq``'s next token (reserved already) and up to ``num_drafts`` draft tokens
        after it, from free blocks only: a draft never evicts a cached prefix or preempts
        anyone. Returns how many drafts fit."""
        if self.pool is None:
            return num_drafts
        bs = self.pool.block_size
        need = -(-(seq.num_computed + 1 + num_drafts) // bs) - len(seq.block_ids)
        if need > 0:
            got = min(need, self.pool.num_free)
            seq.block_ids += self.pool.allocate(got) if got else []
        return min(num_drafts, len(seq.block_ids) * bs - seq.num_computed - 1)

    def trim(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks past its computed tokens (those of rejected drafts). They
        never held an accepted token, so the prefix cache never indexed them."""
        if self.pool is None:
            return
        keep = max(1, -(-seq.num_computed // self.pool.block_size))
        if len(seq.block_ids) > keep:
            self.pool.release(seq.block_ids[keep:])
            del seq.block_ids[keep:]

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
        return self.radix.evict(self.radix.num_cached_blocks) if self.radix is not None else 0

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
        if best is None or self._prefix_in_flight(best):
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
        """``job``'s next inputs whose padded batch fits ``budget``: None if not even one does,
        unless the budget is a whole step's (an input longer than that runs alone)."""
        start = end = job.num_scheduled
        while end < job.num_inputs and job.length(end) * (end + 1 - start) <= budget:
            end += 1
        if end == start:
            if budget < self.config.prefill_chunk:
                return None
            end += 1
        job.num_scheduled = end
        chunk = EmbedChunk(job, start, end)
        if chunk.is_last:  # every input is scheduled: the engine answers after this step
            self.drop_embed(job)
        return chunk

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """Whether a sequence being prefilled starts with ``seq``'s first full block, which the
        prefix cache does not hold yet (``n > 1`` choices, a burst of requests with one system
        prompt): its blocks are indexed when its prompt is done, and ``seq`` can share them."""
        if self.pool is None or self.radix is None:
            return False
        bs = self.pool.block_size
        first = seq.prefill_ids[:bs]
        if len(seq.prefill_ids) <= bs:
            return False  # no full block to share: at least one prompt token is computed anyway
        sharing = [o for o in self.prefilling if o.prefill_ids[:bs] == first]
        if not sharing:
            return False
        if self.radix.state_budget is not None:  # a hybrid: for a prompt that came after
            self._snapshot_for(seq, sharing[0])  # ``sharing[0]`` was admitted (``_ask_snapshots``)
        return self.radix.match_prefix(seq.prefill_ids, max_blocks=1).shared_blocks == 0

    def _ask_snapshots(self, seq: Sequence) -> None:
        """A hybrid's shared blocks are no use without a recurrent state where a prompt parts
        from them: ``seq``, admitted, snapshots where each waiting prompt sharing its first
        block parts from it (those wait for it: ``_prefix_in_flight``)."""
        assert self.pool is not None
        first = seq.prefill_ids[: self.pool.block_size]
        for other in self.waiting:
            if other is not seq and other.prefill_ids[: len(first)] == first:
                self._snapshot_for(other, seq)

    def _snapshot_for(self, seq: Sequence, other: Sequence) -> None:
        """Ask ``other``, prefilling, to snapshot its recurrent state where ``seq``'s prompt
        parts from it, unless it has passed there already."""
        assert self.pool is not None
        n = min(len(seq.prefill_ids) - 1, len(other.prefill_ids))
        shared = next((i for i in range(n) if seq.prefill_ids[i] != other.prefill_ids[i]), n)
        boundary = shared // self.pool.block_size * self.pool.block_size
        if boundary > other.num_prefilled:
            other.snapshot_at.add(boundary)

    def _num_slots_used(self) -> int:
        return len(self.running) + len(self.prefilling)

    def _chunk(self, seq: Sequence, budget: int) -> PrefillChunk:
        start = seq.num_prefilled
        budget = min(budget, self.config.prefill_chunk)  # a row's share (``prefill_rows``)
        if self.running:  # streams wait on this step: a chunk within the budget's cost
            floor = min(budget, max(MIN_CHUNK, self.config.prefill_chunk // MAX_SHRINK))
            budget = max(floor, self.cost.tokens_within(budget, start))
        end = self._window_room(seq, min(seq.num_prefill_tokens, start + budget))
        return PrefillChunk(seq, start, max(start, end))

    def _window_room(self, seq: Sequence, end: int) -> int:
        """A windowed model: slabs for ``seq``'s blocks up to token ``end``, or as far as they
        can be had; returns the end they cover."""
        if self.windows is None:
            return end
        missing = self.windows.missing(seq, end)
        if missing and not self._make_room(0, missing):
            got = min(missing, self.windows.pool.num_free)
            end = min(end, (len(seq.window_ids) + got) * self.windows.block_size)
        self.windows.grow(seq, end)
        return end

    def _spent(self, chunk: PrefillChunk | EmbedChunk) -> int:
        if isinstance(chunk, EmbedChunk) or not self.running:
            return chunk.num_tokens
        return math.ceil(self.cost.of(chunk.start, chunk.num_tokens))

    def _allocate_prompt(self, seq: Sequence) -> bool:
        """Give ``seq`` the cached blocks of its longest cached prefix plus new blocks for the
        rest of its prompt, if they fit. At least one token is left to prefill: its logits
        give the first output token.

        A windowed model's arrays may hold the room at ids the cache's blocks pin (a hit's
        own, high in the arrays): when nothing else runs, the cache is dropped and the arrays
        shrink (``_start_over``), and the prompt is computed from scratch, which the context
        cap guarantees fits alone."""
        if self._admit(seq):
            return True
        if self.windows is None or self.running or self.prefilling:
            return False
        self._start_over()
        return self._admit(seq)

    def _start_over(self) -> None:
        """Nothing runs and the head of the queue cannot proceed: every cached block and slab
        goes, and the runner's arrays shrink to their first chunks."""
        self.flush_prefix_cache()
        if self.reclaim is not None:
            self.reclaim()

    def _admit(self, seq: Sequence) -> bool:
        """``_allocate_prompt``'s one attempt."""
        if self.pool is None or self.radix is None:
            return True
        tokens = seq.prefill_ids
        match = self.radix.match_prefix(  # restore: blocks the disk tier holds come back
            tokens, max_blocks=(len(tokens) - 1) // self.pool.block_size, restore=True
        )
        self.radix.lock(match.node)  # so making room cannot evict the prefix we are about to use
        need = self.pool.blocks_for(len(tokens)) - match.num_blocks
        hit = match.num_blocks * self.pool.block_size
        first = min(len(tokens), hit + self.config.prefill_chunk)  # its first chunk's slabs
        slabs = self.pool.blocks_for(first) - match.num_blocks if self.windows else 0
        if self.windows is not None:  # held first: making room may drop the tree's slabs
            self.windows.restore(seq, match.window, hit)
        if not self._make_room(need, slabs):
            if self.windows is not None:
                self.windows.release(seq)
            self.radix.unlock(match.node)
            return False
        self.pool.retain(match.block_ids)
        seq.block_ids = match.block_ids + self.pool.allocate(need, keep=self._slab_bytes(slabs))
        seq.prefix_node = match.node
        seq.state_hit = match.node.state
        if self.windows is not None:
            self.windows.grow(seq, first)
        seq.snapshot_at = {match.shared_blocks * self.pool.block_size} - {0}
        if self.radix.state_budget is not None:
            self._ask_snapshots(seq)
        seq.num_prefilled = seq.num_computed = match.num_blocks * self.pool.block_size
        if not seq.num_preemptions:  # a resumed sequence's own blocks are not a cache hit
            seq.num_cached = seq.num_computed
            self._count_lookup(seq.num_cached)
        return True

    def _count_lookup(self, num_cached: int) -> None:
        self.counters.hits += bool(num_cached)
        self.counters.misses += not num_cached
        self.counters.hit_tokens += num_cached

    def _make_room(self, num_blocks: int, slabs: int = 0) -> bool:
        """Whether ``num_blocks`` blocks (and ``slabs`` window slabs) are free, evicting
        unreferenced cached blocks (and the prefix cache's slabs) if needed."""
        assert self.pool is not None and self.radix is not None
        short = num_blocks - self.pool.num_free
        if self.windows is None:
            if short > 0:
                self.radix.evict(short)
            return self.pool.num_free >= num_blocks
        reclaimed = False
        while not self._fits(num_blocks, slabs):
            # the pool that is short first: a freed id serves its own pool (the arrays stay)
            blocks = max(1, num_blocks - self.pool.num_free)
            if slabs > self.windows.pool.num_free and self.radix.drop_slabs(slabs):
                continue
            if self.radix.evict(blocks) or self.radix.drop_slabs(max(1, slabs)):
                continue
            if reclaimed or self.reclaim is None or not self.reclaim():
                return False
            reclaimed = True
        return True

    def _slab_bytes(self, slabs: int) -> int:
        """What ``slabs`` more window slabs take of the budget: none where the slab arrays
        have free room (none without windows)."""
        return 0 if self.windows is None else self.windows.pool.growth_bytes(slabs)

    def _fits(self, num_blocks: int, slabs: int) -> bool:
        """Whether ``num_blocks`` blocks and ``slabs`` slabs are free together (one budget)."""
        assert self.pool is not None and self.windows is not None and self.pool.budget
        grow = self.pool.growth_bytes(num_blocks) + self.windows.pool.growth_bytes(slabs)
        return (
            self.pool.num_free >= num_blocks
            and self.windows.pool.num_free >= slabs
            and self.pool.budget.free >= grow
        )

    def _victim(self) -> Sequence:
        """Whom to preempt: the lowest priority, then the most recent arrival."""
        return max(self.running + self.prefilling, key=lambda s: (s.priority, s.arrival))

    def _preempt(self, seq: Sequence, cache: bool = True) -> None:
        """Free ``seq``'s blocks and queue it again to recompute its prompt and output so far."""
        for queue in (self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        self._free_blocks(seq, cache=cache)
        seq.num_resumed = seq.num_output_tokens
        seq.num_prefilled = 0
        seq.num_preemptions += 1
        self.counters.preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def _free_blocks(self, seq: Sequence, cache: bool) -> None:
        """Release ``seq``'s blocks; the full blocks of known tokens stay in the prefix cache."""
        if self.pool is None or self.radix is None or not seq.block_ids:
            return
        if cache:  # (a windowed model's slabs with them: its next turn or its resume hits)
            known = (seq.prompt_ids + seq.output_ids)[: seq.num_computed]
            self.radix.insert(known, seq.block_ids, seq.states, seq.window_ids)
        seq.states, seq.state_hit = {}, None
        if self.windows is not None:
            self.windows.release(seq)
        if seq.prefix_node is not None:
            self.radix.unlock(seq.prefix_node)
        self.pool.release(seq.block_ids)
        seq.block_ids, seq.prefix_node, seq.num_computed = [], None, 0

    def num_live_blocks(self) -> int:
        """Distinct blocks that sequences in flight hold (shared prefix blocks count once)."""
        return len({b for q in (self.prefilling, self.running) for s in q for b in s.block_ids})

    def kv_report(self) -> KVReport:
        c = self.counters
        if self.pool is None or self.radix is None:  # hits of the runner's snapshots, if any
            return KVReport(
                preemptions=c.preemptions, hits=c.hits, misses=c.misses, hit_tokens=c.hit_tokens
            )
        p = self.pool
        return KVReport(
            preemptions=c.preemptions,
            hits=c.hits,
            misses=c.misses,
            hit_tokens=c.hit_tokens,
            block_size=p.block_size,
            blocks_total=p.num_blocks,
            blocks_used=p.num_used,
            blocks_free=p.num_free,
            blocks_cached=self.radix.num_cached_blocks,
        )

    def check_invariants(self) -> None:
        """The pool's and the prefix cache's invariants, and every live block accounted for."""
        if self.pool is None or self.radix is None:
            return
        self.pool.check_invariants()
        self.radix.check_invariants()
        live = [b for q in (self.prefilling, self.running) for s in q for b in s.block_ids]
        assert not any(s.block_ids for s in self.waiting), "a waiting sequence holds blocks"
        if self.windows is not None:
            self.windows.check(self.prefilling + self.running)
            assert not any(s.window_ids for s in self.waiting), "a waiting sequence holds slabs"
        assert all(self.pool.ref_count(b) >= live.count(b) for b in set(live))
