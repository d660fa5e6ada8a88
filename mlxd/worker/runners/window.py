"""The paged runner for sliding-window models: full-attention layers in blocks, window layers
in slabs that go back once behind the window (``window_slabs``).

A windowed model's cache list (``make_cache()``) mixes plain K/V caches with sliding-window
ones (``RotatingKVCache``). Here each kind has its own pool: the full layers' ``pool``, read
through each row's ``block_ids`` as for any model, and the window layers' ``windows``, read
through its ``window_ids`` (the scratch block where a slab went back). A forward builds one
``PagedStep`` per pool from the same positions; the window layers' masks keep keys within the
window (``PagedStep.window_mask``), so the slabs read past it are never seen. Decode keeps a
tail per pool, flushed together. The scheduler's KV ledger takes and returns slabs
(``window_slabs()``, handed to it by the builder); this runner only reads the tables. Drafts
are not verified (``speculates``): the window pool would need its own verification tables.
"""

from __future__ import annotations

from typing import Any

from mlxd.worker.kv import layer_caches
from mlxd.worker.kv.block_pool import BlockPool, KVBudget
from mlxd.worker.kv.decode_tail import VIEW_STEP, DecodeTail, decode_caches
from mlxd.worker.kv.formats import KVFormat
from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep
from mlxd.worker.kv.window_slabs import WindowSlabs
from mlxd.worker.runners.paged import PagedModelRunner, with_images
from mlxd.worker.sched.sequence import Sequence


def margin(block_size: int) -> int:
    """Tokens a slab is kept after it leaves the window: decode writes its tokens into the
    pool at a flush, up to ``VIEW_STEP`` of them late, and a finished sequence leaves the
    window of its last block boundary to the prefix cache (``window_slabs``)."""
    return max(VIEW_STEP, block_size)


class WindowModelRunner(PagedModelRunner):
    """``PagedModelRunner`` for models whose layers are full attention and sliding windows."""

    speculates = False

    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        pool: KVPool,
        windows: KVPool,
        slabs: BlockPool,
        window: int,
        max_view_tokens: int | None = None,
    ) -> None:
        """``windows``: the window layers' arrays, their slab ids handed out by ``slabs``
        (which shares its budget with the allocator of ``pool``'s blocks)."""
        super().__init__(model, eos_token_ids, pool, max_view_tokens)
        self.windows = windows
        self.slabs = slabs
        self.window = window
        self.wtail = DecodeTail(len(windows.keys), self.max_view_tokens)
        self.blocks: BlockPool | None = None  # the full layers' allocator (``for_model``)
        self._windowed = layer_caches.window_entries(layer_caches.model_caches(model))

    @classmethod
    def for_model(
        cls,
        model: Any,
        eos_token_ids: set[int],
        num_blocks: int,
        block_size: int,
        window: int,
        chunk_bytes: int | None = None,
        fmt: KVFormat | None = None,
        max_view_tokens: int | None = None,
    ) -> tuple[WindowModelRunner, BlockPool]:
        """The runner for ``model`` and the allocator of its full layers' blocks, in the budget
        of ``num_blocks`` blocks of every layer: each pool's arrays grow (``chunk_bytes`` or
        more at a time) as ids past them are handed out, both paid from the budget."""
        costs = [KVPool.bytes_per_token(model, fmt, windows=w) * block_size for w in (False, True)]
        budget = KVBudget(num_blocks * sum(costs))
        ids = [budget.total // cost for cost in costs]
        # each pool's arrays start at a chunk (at most an eighth of the budget), which they never
        # shrink below, and grow and shrink (``reclaim``) as the other's leave room
        chunk = min(chunk_bytes or budget.total, budget.total // 8)
        first = [max(1, chunk // c) for c in costs]
        pool, windows = (
            KVPool.for_model(model, n, block_size, c, fmt, windows=w)
            for n, c, w in zip(ids, first, (False, True), strict=True)
        )
        blocks, slabs = (
            BlockPool(n, block_size, budget, c, kv.capacity, kv.ensure)
            for n, c, kv in zip(ids, costs, (pool, windows), strict=True)
        )
        runner = cls(model, eos_token_ids, pool, windows, slabs, window, max_view_tokens)
        runner.blocks = blocks
        return runner, blocks

    def context_blocks(self, in_window: int) -> int:
        """The most blocks one sequence may hold alone, with ``in_window`` slabs at most (its
        window, the margin and a prefill chunk) beside them: within the budget, the window
        pool's arrays never below their first chunk."""
        assert self.blocks is not None and self.slabs.budget is not None
        full, windowed, total = self.blocks.cost, self.slabs.cost, self.slabs.budget.total
        floor = self.windows.chunk_blocks
        past = (total - max(in_window, floor) * windowed) // full  # more blocks than slabs
        if past >= in_window:
            return past
        each = total // (full + windowed)  # fewer: every block with its slab
        if each >= floor:
            return min(each, in_window)
        return max(0, min(floor, (total - floor * windowed) // full))

    # Public API

    def window_slabs(self) -> WindowSlabs:
        """The slabs of this runner's window pool, as the scheduler's KV ledger hands them out
        (``KVLedger.keep_windows``, which the builder calls with ``reclaim``)."""
        return WindowSlabs(self.slabs, self.window, margin(self.pool.block_size))

    def release_memory(self, highest_used: int) -> int:
        """Both pools shrink to the ids in use (``idle_release`` let go of the prefix cache's
        slabs above the window pool's first chunk), then MLX's cache is freed again."""
        dropped = super().release_memory(highest_used)
        dropped += self.windows.shrink(self.slabs.highest_used())
        self.free_memory()
        self._paid()
        return dropped

    def reclaim(self) -> bool:
        """Out of room under load: both pools' arrays shrink to the ids in use, so the budget
        they held past them pays for the other's (the step in flight done and decode's tokens
        in the pool first). Returns whether any shrank."""
        self.settle()
        assert self.blocks is not None
        dropped = self.pool.shrink(self.blocks.highest_used())
        dropped += self.windows.shrink(self.slabs.highest_used())
        self._paid()
        return dropped > 0

    def _paid(self) -> None:
        """The allocators pay for what the arrays hold now."""
        for kv, ids in ((self.pool, self.blocks), (self.windows, self.slabs)):
            if ids is not None and ids.capacity != kv.capacity:
                ids.set_capacity(kv.capacity)

    @property
    def kv_budget_bytes(self) -> int:
        assert self.slabs.budget is not None
        return self.slabs.budget.total + self._view_bytes

    @property
    def kv_description(self) -> str:
        w = self.windows
        return (
            f"{super().kv_description}; {len(w.keys)} of {len(self._windowed)} layers see a "
            f"{self.window}-token window: their K/V in slabs that go back behind it "
            f"({w.capacity} held)"
        )

    # Internal helpers

    @property
    def _view_bytes(self) -> int:
        per_token = (
            self.pool.bytes_per_block + self.windows.bytes_per_block
        ) // self.pool.block_size
        return self.max_view_tokens * per_token

    def _kv(self) -> list[tuple[KVPool, DecodeTail]]:
        return [(self.pool, self.tail), (self.windows, self.wtail)]

    def _caches(self, full: list[Any], windowed: list[Any]) -> list[Any]:
        """The model's cache list: each pool's layers, in the model's order."""
        f, w = iter(full), iter(windowed)
        return [next(w) if is_window else next(f) for is_window in self._windowed]

    def _tables(self, seqs: list[Sequence], blocks: list[int]) -> list[list[int]]:
        """Each row's slab table over its first ``blocks[b]`` blocks (-1 where a slab went
        back: the scratch block is read there, masked out, outside the window)."""
        for seq, n in zip(seqs, blocks, strict=True):
            assert len(seq.window_ids) >= n, f"{seq.request_id} has no slab for a block it reads"
        return [seq.window_ids[:n] for seq, n in zip(seqs, blocks, strict=True)]

    def _step_caches(
        self, seqs: list[Sequence], starts: list[int], new: list[int], exact: bool = False
    ) -> list[Any]:
        full = super()._step_caches(seqs, starts, new, exact)
        blocks = [-(-(s + n) // self.pool.block_size) for s, n in zip(starts, new, strict=True)]
        step = PagedStep.build(self._tables(seqs, blocks), starts, new, self.windows, exact)
        step = with_images(step, seqs, starts, new)
        return self._caches(full, PagedKVCache.for_step(self.windows, step))

    def _decode_caches(self, rows: list[Sequence]) -> list[Any]:
        positions = [s.num_computed for s in rows]
        blocks = [p // self.pool.block_size + 1 for p in positions]
        windowed = decode_caches(self.windows, self.wtail, self._tables(rows, blocks), positions)
        return self._caches(super()._decode_caches(rows), windowed)
