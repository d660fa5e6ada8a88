"""The KV ledger: which blocks (and window slabs) each sequence in flight holds, and room for more.

The scheduler decides who runs; the ledger answers whether their K/V fits. It owns the block pool,
the prefix cache over it (``RadixCache``) and, for a sliding-window model, the window slabs and the
runner's ``reclaim``. ``admit`` gives a prompt its cached prefix and new blocks, ``grow`` a decode
step's next block, ``free`` gives a sequence's blocks back (the full blocks of its known tokens
stay cached). Each makes room first by evicting unreferenced cached blocks, before the pool's
arrays grow past twice the most the sequences in flight have held (so memory follows the load,
not the cache's history); when that is not enough it says no, and the scheduler preempts the
``victim`` the ledger names and frees it here.

A hybrid's prefix cache also keeps recurrent-state snapshots: the ledger asks prefilling prompts
to take them where waiting ones part from them (``prefix_in_flight``), and indexes them as they
come (``index_chunk``).

Pure Python on ints, as the scheduler: no MLX here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.kv.window_slabs import WindowSlabs
from mlxd.worker.prefix.radix_cache import PrefixMatch, RadixCache
from mlxd.worker.sched import image_spans
from mlxd.worker.sched.sequence import Sequence
from mlxd.worker.stats import KVReport

EVICT_BATCH = 16  # cached blocks evicted at least, once the cache has had its room


class KVLedger:
    """The blocks and slabs of the sequences in flight, over one ``BlockPool`` and its prefix
    cache.

    Args:
        pool: the allocator of the paged cache's block ids (of the full-attention layers' blocks
            for a sliding-window model).
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.radix = RadixCache(pool)
        # A sliding-window model's window layers: their slabs, taken and given back here
        # (window_slabs.py; set by the builder with ``keep_windows``).
        self.windows: WindowSlabs | None = None
        # Out of room: the runner's arrays shrink to the ids in use, their budget freed for the
        # other pool's (``WindowModelRunner.reclaim``); None where arrays pay for no budget.
        self.reclaim: Callable[[], bool] | None = None
        # The most blocks sequences in flight have held at once: the prefix cache may make the
        # pool's arrays hold as many again before it evicts rather than let them grow.
        self.peak_in_flight = 0

    # Public API

    def keep_windows(self, windows: WindowSlabs, reclaim: Callable[[], bool] | None) -> None:
        """A sliding-window model: hand out ``windows``' slabs beside the blocks (the prefix
        cache keeps them by block); ``reclaim`` shrinks the runner's arrays when out of room."""
        self.windows = windows
        self.reclaim = reclaim
        self.radix.keep_slabs(windows.pool, windows.span)

    def admit(self, seq: Sequence, first_chunk: int, waiting: list[Sequence], alone: bool) -> bool:
        """Give ``seq`` the cached blocks of its longest cached prefix plus new blocks for the
        rest of its prompt, if they fit. At least one token is left to prefill: its logits
        give the first output token.

        Args:
            seq: the waiting sequence to admit; its ``num_cached`` is set unless it resumes.
            first_chunk: the tokens its first prefill chunk may take (a windowed model's slabs).
            waiting: the queue; a hybrid asks ``seq`` to snapshot where their prompts part.
            alone: nothing else runs or prefills. A windowed model's arrays may hold the room at
                ids the cache's blocks pin (a hit's own, high in the arrays): then the cache is
                dropped and the arrays shrink (``start_over``), and the prompt is computed from
                scratch, which the context cap guarantees fits alone.

        Returns:
            Whether ``seq`` holds its prompt's blocks now.
        """
        if self._admit(seq, first_chunk, waiting):
            return True
        if self.windows is None or not alone:
            return False
        self.start_over()
        return self._admit(seq, first_chunk, waiting)

    def grow(self, seq: Sequence) -> bool:
        """Room for the token ``seq``'s next decode step writes: a new block (and slab) when
        its last block is full, evicting cached blocks for it. False: none even so."""
        if seq.num_computed < len(seq.block_ids) * self.pool.block_size:
            return True
        if not self._make_room(1, int(self.windows is not None)):
            return False
        seq.block_ids += self.pool.allocate(1, keep=self._slab_bytes(1))
        if self.windows is not None:
            self.windows.grow(seq, seq.num_computed + 1)
        return True

    @staticmethod
    def victim(in_flight: list[Sequence]) -> Sequence:
        """Whose KV goes to make room (preempted, it recomputes later): the lowest priority,
        then the most recent arrival. A rule, not a use of the pool: the contiguous cache,
        with no ledger, preempts by it too."""
        return max(in_flight, key=lambda s: (s.priority, s.arrival))

    def drop_behind(self, rows: list[Sequence]) -> None:
        """Before a decode step: each row's slabs behind its window and margin go back."""
        if self.windows is not None:
            for seq in rows:
                self.windows.drop_behind(seq)

    def window_room(self, seq: Sequence, end: int) -> int:
        """A windowed model: slabs for ``seq``'s blocks up to token ``end``, or as far as they
        can be had; returns the end they cover (``end`` without windows)."""
        if self.windows is None:
            return end
        missing = self.windows.missing(seq, end)
        if missing and not self._make_room(0, missing):
            got = min(missing, self.windows.pool.num_free)
            end = min(end, (len(seq.window_ids) + got) * self.windows.block_size)
        self.windows.grow(seq, end)
        return end

    def reserve_drafts(self, seq: Sequence, num_drafts: int) -> int:
        """Room for ``seq``'s next token (reserved already) and up to ``num_drafts`` draft tokens
        after it, from free blocks only: a draft never evicts a cached prefix or preempts
        anyone. Returns how many drafts fit."""
        bs = self.pool.block_size
        need = -(-(seq.num_computed + 1 + num_drafts) // bs) - len(seq.block_ids)
        if need > 0:
            got = min(need, self.pool.num_free)
            seq.block_ids += self.pool.allocate(got) if got else []
        return min(num_drafts, len(seq.block_ids) * bs - seq.num_computed - 1)

    def trim(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks past its computed tokens (those of rejected drafts). They
        never held an accepted token, so the prefix cache never indexed them."""
        keep = max(1, -(-seq.num_computed // self.pool.block_size))
        if len(seq.block_ids) > keep:
            self.pool.release(seq.block_ids[keep:])
            del seq.block_ids[keep:]

    def free(self, seq: Sequence, cache: bool) -> None:
        """Release ``seq``'s blocks; with ``cache``, the full blocks of its known tokens stay in
        the prefix cache (a windowed model's slabs with them: its next turn or its resume hits).
        """
        if not seq.block_ids:
            return
        if cache:
            known = seq.known_keys[: seq.num_computed]
            self.radix.insert(known, seq.block_ids, seq.states, seq.window_ids)
        seq.states, seq.state_hit = {}, None
        if self.windows is not None:
            self.windows.release(seq)
        if seq.prefix_node is not None:
            self.radix.unlock(seq.prefix_node)
        self.pool.release(seq.block_ids)
        seq.block_ids, seq.prefix_node, seq.num_computed = [], None, 0

    def index_chunk(self, seq: Sequence, is_last: bool) -> None:
        """A prefill chunk of ``seq`` ran: a windowed model's blocks computed so far and their
        slabs go to the prefix cache before those behind the window go back; a hybrid's
        snapshots go there as prefill takes them (nothing else bounds them)."""
        if self.windows is not None:
            known = seq.prefill_keys[: seq.num_computed]
            self.radix.insert(known, seq.block_ids, slabs=seq.window_ids)
            self.windows.drop_behind(seq)
        if seq.states and not is_last:
            self.radix.insert(seq.prefill_keys[: seq.num_computed], seq.block_ids, seq.states)
            seq.states = {}

    def index_prompt(self, seq: Sequence) -> None:
        """``seq``'s prompt is done: later requests with this prefix can share its blocks."""
        self.radix.insert(seq.prefill_keys, seq.block_ids, seq.states)
        seq.states = {}

    def prefix_in_flight(self, seq: Sequence, prefilling: list[Sequence]) -> bool:
        """Whether a sequence being prefilled starts with ``seq``'s first full block, which the
        prefix cache does not hold yet (``n > 1`` choices, a burst of requests with one system
        prompt): its blocks are indexed when its prompt is done, and ``seq`` can share them."""
        bs = self.pool.block_size
        first = seq.prefill_keys[:bs]
        if len(seq.prefill_keys) <= bs:
            return False  # no full block to share: at least one prompt token is computed anyway
        sharing = [o for o in prefilling if o.prefill_keys[:bs] == first]
        if not sharing:
            return False
        if self.radix.state_budget is not None:  # a hybrid: for a prompt that came after
            self._snapshot_for(seq, sharing[0])  # ``sharing[0]`` was admitted (``_ask_snapshots``)
        return self.radix.match_prefix(seq.prefill_keys, max_blocks=1).shared_blocks == 0

    def start_over(self) -> None:
        """Nothing runs and the head of the queue cannot proceed: every cached block and slab
        goes, and the runner's arrays shrink to their first chunks."""
        self.flush()
        if self.reclaim is not None:
            self.reclaim()

    def flush(self) -> int:
        """Drop every cached block no running sequence uses; returns how many were freed."""
        return self.radix.evict(self.radix.num_cached_blocks)

    def report(self, counts: KVReport) -> KVReport:
        """``counts`` (the scheduler's hits and preemptions) with the pool's numbers now."""
        p = self.pool
        return dataclasses.replace(
            counts,
            block_size=p.block_size,
            blocks_total=p.num_blocks,
            blocks_used=p.num_used,
            blocks_free=p.num_free,
            blocks_cached=self.radix.num_cached_blocks,
        )

    def check_invariants(self, live: list[Sequence], waiting: list[Sequence]) -> None:
        """The pool's and the prefix cache's invariants, every block of the ``live`` sequences
        accounted for, and none held by a ``waiting`` one."""
        self.pool.check_invariants()
        self.radix.check_invariants()
        held = [b for s in live for b in s.block_ids]
        assert not any(s.block_ids for s in waiting), "a waiting sequence holds blocks"
        if self.windows is not None:
            self.windows.check(live)
            assert not any(s.window_ids for s in waiting), "a waiting sequence holds slabs"
        assert all(self.pool.ref_count(b) >= held.count(b) for b in set(held))

    # Internal helpers

    def _admit(self, seq: Sequence, first_chunk: int, waiting: list[Sequence]) -> bool:
        """``admit``'s one attempt."""
        tokens = seq.prefill_keys
        match = self._match(seq, (len(tokens) - 1) // self.pool.block_size)
        self.radix.lock(match.node)  # so making room cannot evict the prefix we are about to use
        need = self.pool.blocks_for(len(tokens)) - match.num_blocks
        hit = match.num_blocks * self.pool.block_size
        first = min(len(tokens), hit + first_chunk)  # its first chunk's slabs
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
            self._ask_snapshots(seq, waiting)
        seq.num_prefilled = seq.num_computed = match.num_blocks * self.pool.block_size
        if not seq.num_preemptions:  # a resumed sequence's own blocks are not a cache hit
            seq.num_cached = seq.num_computed
        return True

    def _match(self, seq: Sequence, max_blocks: int) -> PrefixMatch:
        """The longest cached prefix of ``seq``'s keys within ``max_blocks`` blocks that cuts
        none of its images whose tokens attend both ways (``image_spans.hit_end``)."""
        bs = self.pool.block_size
        while True:  # a shorter match may end elsewhere (a windowed one: where slabs are kept)
            # restore: blocks the disk tier holds come back
            match = self.radix.match_prefix(seq.prefill_keys, max_blocks=max_blocks, restore=True)
            max_blocks = image_spans.hit_end(seq.image_spans, match.num_blocks * bs, bs) // bs
            if max_blocks == match.num_blocks:
                return match

    def _ask_snapshots(self, seq: Sequence, waiting: list[Sequence]) -> None:
        """A hybrid's shared blocks are no use without a recurrent state where a prompt parts
        from them: ``seq``, admitted, snapshots where each waiting prompt sharing its first
        block parts from it (those wait for it: ``prefix_in_flight``)."""
        first = seq.prefill_keys[: self.pool.block_size]
        for other in waiting:
            if other is not seq and other.prefill_keys[: len(first)] == first:
                self._snapshot_for(other, seq)

    def _snapshot_for(self, seq: Sequence, other: Sequence) -> None:
        """Ask ``other``, prefilling, to snapshot its recurrent state where ``seq``'s prompt
        parts from it, unless it has passed there already."""
        n = min(len(seq.prefill_keys) - 1, len(other.prefill_keys))
        shared = next((i for i in range(n) if seq.prefill_keys[i] != other.prefill_keys[i]), n)
        boundary = shared // self.pool.block_size * self.pool.block_size
        if boundary > other.num_prefilled:
            other.snapshot_at.add(boundary)

    def _make_room(self, num_blocks: int, slabs: int = 0) -> bool:
        """Whether ``num_blocks`` blocks (and ``slabs`` window slabs) are free, evicting
        unreferenced cached blocks (and the prefix cache's slabs) if needed. Once the cache has
        had as much room as the load (``_cache_had_its_room``), cached blocks go before the
        pool's arrays grow (``EVICT_BATCH`` at a time, since each eviction walks the tree);
        before that, the arrays grow to twice the load's peak at once. Memory steps up with
        the load's peak and stays there, instead of climbing to the budget as the cache fills."""
        short = num_blocks - self.pool.num_free_held
        if short > 0:
            if num_blocks > self.pool.num_free or self._cache_had_its_room(num_blocks):
                self.radix.evict(max(short, EVICT_BATCH))
            else:  # the room in one growth, while the load sets its peak, not as the cache fills
                self.pool.reserve(2 * self.peak_in_flight)
        if self.windows is None:
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

    def _cache_had_its_room(self, num_blocks: int) -> bool:
        """Whether the pool's arrays hold twice the most blocks the sequences in flight have
        held at once (with ``num_blocks`` more): the cache has had as much room as the load,
        so it makes room before the arrays grow. Short of that they grow, so a conversation's
        cached prefix outlives another one's turn (an agent's context across a sub-agent's)."""
        in_flight = self.pool.num_used - self.radix.num_cache_only() + num_blocks
        self.peak_in_flight = max(self.peak_in_flight, in_flight)
        return self.pool.num_held >= 2 * self.peak_in_flight

    def _slab_bytes(self, slabs: int) -> int:
        """What ``slabs`` more window slabs take of the budget: none where the slab arrays
        have free room (none without windows)."""
        return 0 if self.windows is None else self.windows.pool.growth_bytes(slabs)

    def _fits(self, num_blocks: int, slabs: int) -> bool:
        """Whether ``num_blocks`` blocks and ``slabs`` slabs are free together (one budget)."""
        assert self.windows is not None and self.pool.budget
        grow = self.pool.growth_bytes(num_blocks) + self.windows.pool.growth_bytes(slabs)
        return (
            self.pool.num_free >= num_blocks
            and self.windows.pool.num_free >= slabs
            and self.pool.budget.free >= grow
        )
