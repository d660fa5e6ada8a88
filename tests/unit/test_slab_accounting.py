"""A windowed model's two kinds of blocks from one budget (``block_pool.KVBudget``) and the
scheduler's rules for its window slabs (``window_slabs``): taken a chunk ahead, given back
behind the window and its margin, held by prefix states, all back once the cache is flushed.
The runner's part (what a forward computes) is in tests/model/test_window_slabs.py."""

from __future__ import annotations

import pytest

from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import SamplingParams
from mlxd.worker.block_pool import BlockPool, KVBudget
from mlxd.worker.scheduler import PrefillChunk, Scheduler
from mlxd.worker.sequence import Sequence
from mlxd.worker.window_slabs import WindowSlabs

BS, WINDOW, MARGIN = 4, 8, 4


def test_two_pools_share_one_budget_of_bytes() -> None:
    budget = KVBudget(100)
    blocks, slabs = BlockPool(50, BS, budget, cost=10), BlockPool(20, BS, budget, cost=30)
    ids = blocks.allocate(4)  # 40 bytes
    assert (blocks.num_free, slabs.num_free) == (6, 2)
    slab = slabs.allocate(2)  # 60 more: the budget is spent
    assert (blocks.num_free, slabs.num_free, budget.free) == (0, 0, 0)
    with pytest.raises(MemoryError):
        blocks.allocate(1)
    slabs.release(slab[:1])
    assert (blocks.num_free, slabs.num_free) == (3, 1)
    blocks.release(ids)
    slabs.release(slab[1:])
    assert budget.used == 0


def _scheduler(total_blocks: int = 200, nbytes: int = 400) -> tuple[Scheduler, KVBudget]:
    budget = KVBudget(nbytes)
    s = Scheduler(SchedulerConfig(prefill_chunk=16), pool=BlockPool(total_blocks, BS, budget, 1))
    slabs = WindowSlabs(BlockPool(total_blocks, BS, budget, 1), WINDOW, MARGIN, slab_bytes=1)
    s.windows = slabs
    assert s.radix is not None
    s.radix.keep_states(1000, release=slabs.release_state)
    return s, budget


def _prefill_step(s: Scheduler) -> list[PrefillChunk]:
    """One step as the engine runs it: chunks, the runner's ``num_computed``, completion."""
    chunks = [c for c in s.schedule_prefill() if isinstance(c, PrefillChunk)]
    for c in chunks:
        c.seq.num_computed = c.end - 1 if c.is_last else c.end
        s.complete_chunk(c)
    s.check_invariants()
    return chunks


def _seq(rid: str, n: int) -> Sequence:
    return Sequence(request_id=rid, client=b"c", prompt_ids=list(range(n)),
                    sampling=SamplingParams(), max_tokens=8)  # fmt: skip


def test_slabs_are_taken_a_chunk_ahead_and_go_back_behind_the_window() -> None:
    s, _ = _scheduler()
    seq = _seq("a", 80)
    s.add(seq)
    _prefill_step(s)  # tokens 0-15 and their slabs; block 0 (tokens 0-3) ends 8 + 4 before 16
    assert (len(seq.block_ids), seq.window_ids) == (20, [-1, 1, 2, 3])
    while seq in s.prefilling:
        _prefill_step(s)
    held = [i for i, slab in enumerate(seq.window_ids) if slab >= 0]
    # 79 computed: blocks ending at or before 79 - 8 - 4 = 67 went back (0-15), 16-19 stay
    assert held == [16, 17, 18, 19] and len(seq.block_ids) == 20


def test_a_finished_sequence_leaves_its_window_to_the_prefix_cache_and_a_flush_frees_all() -> None:
    s, budget = _scheduler()
    seq = _seq("a", 80)
    s.add(seq)
    while seq in s.prefilling or seq in s.waiting:
        _prefill_step(s)
    s.finish(seq, "stop")
    assert s.radix is not None and s.radix.state_bytes > 0  # a repeat of the prompt may hit
    again = _seq("b", 80)
    s.add(again)
    _prefill_step(s)
    assert again.num_cached == 76  # the hit's window only: blocks 17 and 18 (of tokens 69-75)
    assert again.window_ids[:17] == [-1] * 17 and min(again.window_ids[17:]) >= 0
    s.finish(again, "stop")
    s.flush_prefix_cache()
    assert s.pool is not None and s.windows is not None and s.radix.state_bytes == 0
    assert (s.pool.num_used, s.windows.pool.num_used, budget.used) == (0, 0, 0)


def test_a_failed_sequence_gives_back_the_states_it_took() -> None:
    s, budget = _scheduler()
    seq = _seq("a", 80)
    s.add(seq)
    _prefill_step(s)
    assert s.windows is not None
    s.windows.take(seq, {8})  # as a prefill would, not yet handed to the prefix cache
    s.finish(seq, "error")  # nothing of it is cached
    assert (budget.used, s.windows.pool.num_used) == (0, 0)


def test_making_room_for_a_hit_keeps_the_window_it_restores() -> None:
    """The budget is full with the cached prompt (its 10 blocks and the 2 slabs of its window
    at 36): admitting its repeat must make room, and may drop states to do so; the hit's own
    window is held first, so the repeat waits (nothing else can go) instead of taking a hit
    without it."""
    s, budget = _scheduler()
    seq = _seq("a", 40)
    s.add(seq)
    while seq in s.prefilling or seq in s.waiting:
        _prefill_step(s)
    s.finish(seq, "stop")
    budget.total = budget.used  # nothing else fits
    assert budget.used == 12
    again = _seq("b", 40)
    s.add(again)
    assert _prefill_step(s) == []  # no room: it waits, holding nothing
    assert again in s.waiting and not again.window_ids and not again.block_ids
