"""The paged KV allocator: a free list and a reference count per block. Pure Python, no MLX.

A block holds ``block_size`` tokens of K/V in every layer (``paged_cache.KVPool`` holds the
arrays). Whoever uses a block holds one reference: a sequence for its block table, the prefix
cache for each block it indexes. A block whose count drops to zero is free again.

The lowest free id is handed out first, so the blocks in use stay packed at the low end and
the pool's arrays (which grow in chunks up to ``num_blocks``, see ``paged_cache.KVPool``) need
only reach the highest of them. ``num_free_held`` counts the free ids the arrays already hold
and ``reserve`` grows them at once: the ledger lets them hold twice the most the sequences in
flight have held, and past that evicts cached blocks before they grow, so the pool's memory
follows the load rather than everything the prefix cache has seen.

A sliding-window model keeps two kinds of blocks (its full-attention layers' and its window
layers', ``window_slabs``) in two pools of ids that draw from one ``KVBudget`` of bytes, each
block costing what its layers' K/V take. What a pool pays for is its arrays' *capacity*, not
the ids in use: arrays grow to the highest id handed out and shrink only when told
(``set_capacity``), so two pools that each grew at a different time would otherwise hold
more than the budget together. A pool grows its arrays through ``grow`` as it hands out an id
past them, never beyond what the budget has left.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class KVBudget:
    """Bytes that several block pools share: a block in use takes its pool's ``cost`` of it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    @property
    def free(self) -> int:
        return self.total - self.used


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens, handed out by id (0..num_blocks-1); with a
    ``budget``, ids up to a ``capacity`` its bytes pay for, ``cost`` bytes each."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        budget: KVBudget | None = None,
        cost: int = 1,
        capacity: int = 0,
        grow: Callable[[int, int], int] | None = None,
        held: Callable[[], int] | None = None,
        reserve: Callable[[int], object] | None = None,
    ) -> None:
        """``capacity``: the ids the arrays hold now (paid at once); ``grow(block_id, limit)``
        makes them hold ``block_id``, within ``limit`` ids, and returns how many they hold.
        Without a budget, ``held()`` says how many ids the arrays hold (they grow as written:
        ``KVPool.ensure``) and ``reserve(n)`` makes them hold ``n`` at once; neither: all ids."""
        if num_blocks < 1 or block_size < 1 or cost < 1:
            raise ValueError("a block pool needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.budget = budget
        self.cost = cost
        self._ref_counts = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks))  # a min-heap
        self.capacity = num_blocks
        self._grow = grow or (lambda block_id, limit: block_id + 1)
        self._held = held or (lambda: self.capacity)
        self._reserve = reserve
        if budget is not None:
            self.capacity = capacity
            budget.used += capacity * cost

    # Public API

    @property
    def num_free(self) -> int:
        if self.budget is None:
            return len(self._free)
        beyond = self.num_blocks - self.capacity  # free: never handed out past the arrays
        return self._free_below + min(beyond, self.budget.free // self.cost)

    @property
    def num_held(self) -> int:
        """Ids the arrays hold now (all of them for a pool that does not grow)."""
        return self.capacity if self.budget is not None else min(self.num_blocks, self._held())

    def reserve(self, n: int) -> None:
        """Make the arrays hold ``n`` ids now, in one growth (where they grow by ``held``)."""
        if self._reserve is not None and n > self.num_held:
            self._reserve(min(n, self.num_blocks))

    @property
    def num_free_held(self) -> int:
        """Free ids the arrays hold already: taking more makes them grow. (Ids handed out and
        not yet written may lie past the arrays; counted as inside, they only make this low.)"""
        if self.budget is not None:
            return self._free_below
        return max(0, self.num_held - self.num_used)

    def growth_bytes(self, n: int) -> int:
        """What the budget must add for ``n`` more ids (those past the arrays' free ones)."""
        if self.budget is None:
            return 0
        return max(0, n - self._free_below) * self.cost

    @property
    def _free_below(self) -> int:
        """Free ids the arrays hold (every id past them is free)."""
        return len(self._free) - (self.num_blocks - self.capacity)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks ``num_tokens`` tokens fill (the last one possibly partly)."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int, keep: int = 0) -> list[int]:
        """Take ``n`` free blocks, each with one reference; raise if fewer are free. Arrays
        that grow for them leave ``keep`` bytes of the budget (the other pool's share of the
        same step)."""
        if n > self.num_free:
            raise MemoryError(f"{n} KV blocks asked for, {self.num_free} free")
        ids = [heapq.heappop(self._free) for _ in range(n)]
        for i in ids:
            self._ref_counts[i] = 1
        if ids and self.budget is not None and ids[-1] >= self.capacity:  # lowest first
            limit = self.capacity + (self.budget.free - keep) // self.cost
            grown = self._grow(ids[-1], limit)
            assert ids[-1] < grown <= limit, "the arrays grew past the budget"
            self._charge(grown)
        return ids

    def set_capacity(self, capacity: int) -> None:
        """The arrays hold ``capacity`` ids now (shrunk, above the highest id in use)."""
        assert self.budget is not None and capacity > self.highest_used()
        self._charge(capacity)

    def _charge(self, capacity: int) -> None:
        assert self.budget is not None
        self.budget.used += (capacity - self.capacity) * self.cost
        self.capacity = capacity

    def retain(self, ids: list[int]) -> None:
        """One more reference to each of ``ids`` (all in use)."""
        for i in ids:
            assert self._ref_counts[i] > 0, f"retain of free block {i}"
            self._ref_counts[i] += 1

    def release(self, ids: list[int]) -> int:
        """Drop one reference from each of ``ids``; returns how many became free."""
        freed = 0
        for i in ids:
            assert self._ref_counts[i] > 0, f"release of free block {i}"
            self._ref_counts[i] -= 1
            if self._ref_counts[i] == 0:
                heapq.heappush(self._free, i)
                freed += 1
        return freed

    def highest_used(self) -> int:
        """The highest id in use, -1 if none (O(capacity): for idle moments, not steps)."""
        return next((i for i in range(self.capacity - 1, -1, -1) if self._ref_counts[i]), -1)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def check_invariants(self) -> None:
        """Free + used = total, free blocks have no references, none is free twice."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert all(c >= 0 for c in self._ref_counts), "negative reference count"
        used = {i for i, c in enumerate(self._ref_counts) if c > 0}
        assert not free & used, "a referenced block is on the free list"
        assert len(free) + len(used) == self.num_blocks, "free + used != total"
        assert all(i < self.capacity for i in used), "a block in use past the arrays"
        assert self.budget is None or self.budget.used <= self.budget.total, "over budget"
