"""A windowed model's two kinds of blocks from one budget (``block_pool.KVBudget``) and the
scheduler's rules for its window slabs (``window_slabs``): taken a chunk ahead, given back
behind the window and its margin, held by prefix states, all back once the cache is flushed.
The runner's part (what a forward computes) is in tests/model/test_window_slabs.py."""

from __future__ import annotations

import pytest

from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import SamplingParams
from mlxd.worker.kv.block_pool import BlockPool, KVBudget
from mlxd.worker.kv.window_slabs import WindowSlabs
from mlxd.worker.sched.scheduler import PrefillChunk, Scheduler
from mlxd.worker.sched.sequence import Sequence

BS, WINDOW, MARGIN = 4, 8, 4


def test_two_pools_pay_for_their_arrays_from_one_budget() -> None:
    """A pool pays for the ids its arrays hold (grown as ids past them are handed out), not
    for those in use: an id given back stays paid for until the arrays shrink."""
    budget = KVBudget(100)
    blocks, slabs = BlockPool(50, BS, budget, cost=10), BlockPool(20, BS, budget, cost=30)
    ids = blocks.allocate(4)  # arrays of 4: 40 bytes
    assert (blocks.num_free, slabs.num_free) == (6, 2)
    slab = slabs.allocate(2)  # 60 more: the budget is spent
    assert (blocks.num_free, slabs.num_free, budget.free) == (0, 0, 0)
    with pytest.raises(MemoryError):
        blocks.allocate(1)
    slabs.release(slab[1:])  # id 1 goes back, its arrays stay: only the slabs may reuse it
    assert (blocks.num_free, slabs.num_free) == (0, 1)
    slabs.set_capacity(1)  # the arrays shrank above the ids in use: 30 bytes back
    assert (blocks.num_free, slabs.num_free) == (3, 1)
    blocks.release(ids)
    slabs.release(slab[:1])
    blocks.set_capacity(0)
    slabs.set_capacity(0)
    assert budget.used == 0


def test_arrays_grow_within_what_the_budget_has_left() -> None:
    budget = KVBudget(100)
    asked: list[tuple[int, int]] = []

    def grow(block_id: int, limit: int) -> int:  # chunks of 8, as a KVPool grows
        asked.append((block_id, limit))
        return min(limit, (block_id // 8 + 1) * 8)

    blocks = BlockPool(50, BS, budget, cost=10, grow=grow)
    blocks.allocate(1)
    assert (blocks.capacity, budget.used) == (8, 80)
    blocks.allocate(8)  # id 8 is past them: 2 more is what the budget has left
    assert asked[-1] == (8, 10) and (blocks.capacity, budget.used) == (10, 100)


def _scheduler(total_blocks: int = 200, nbytes: int = 400) -> tuple[Scheduler, KVBudget]:
    budget = KVBudget(nbytes)
    s = Scheduler(SchedulerConfig(prefill_chunk=16), pool=BlockPool(total_blocks, BS, budget, 1))
    s.windows = WindowSlabs(BlockPool(total_blocks, BS, budget, 1), WINDOW, MARGIN)
    assert s.radix is not None
    s.radix.keep_slabs(s.windows.pool, s.windows.span)
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
    return Sequence(
        request_id=rid,
        client=b"c",
        prompt_ids=list(range(n)),
        sampling=SamplingParams(),
        max_tokens=8,
    )


def _prefilled(s: Scheduler, rid: str, n: int) -> Sequence:
    seq = _seq(rid, n)
    s.add(seq)
    while seq in s.prefilling or seq in s.waiting:
        _prefill_step(s)
    return seq


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


def test_the_prefix_cache_keeps_the_slabs_a_sequence_gave_back_until_a_flush() -> None:
    s, budget = _scheduler()
    s.finish(_prefilled(s, "a", 80), "stop")
    assert s.windows is not None and s.windows.pool.num_used == 19  # each computed block's
    again = _seq("b", 80)
    s.add(again)
    _prefill_step(s)
    assert again.num_cached == 76  # the window of the hit only: blocks 17 and 18 (tokens 69-75)
    assert again.window_ids[:17] == [-1] * 17 and min(again.window_ids[17:]) >= 0
    s.finish(again, "stop")
    s.flush_prefix_cache()
    assert s.pool is not None and s.radix is not None
    assert (s.pool.num_used, s.windows.pool.num_used) == (0, 0)
    s.pool.set_capacity(0)  # as the arrays shrink when idle
    s.windows.pool.set_capacity(0)
    assert budget.used == 0


def test_slabs_go_first_from_a_path_s_start_and_a_hit_needs_its_whole_window() -> None:
    s, _ = _scheduler()
    s.finish(_prefilled(s, "a", 80), "stop")
    assert s.radix is not None and s.radix.drop_slabs(17) == 17  # blocks 0-16's
    hit = s.radix.match_prefix(list(range(80)), max_blocks=19)
    assert (hit.num_blocks, hit.shared_blocks) == (19, 19)  # its window (17, 18) is whole
    assert s.radix.drop_slabs(1) == 1  # block 17's: no boundary has its whole window now
    cut = s.radix.match_prefix(list(range(80)), max_blocks=19)
    assert (cut.num_blocks, cut.shared_blocks, cut.window) == (0, 19, [])
    s.check_invariants()


def test_the_cache_keeps_the_slabs_a_sequence_holds_when_room_is_made() -> None:
    """A hit's window is held by the sequence that takes it before room is made for it; letting
    go of the cache's reference to those slabs would free nothing and lose the hit for every
    later prompt (and, if the admission then failed, the slabs themselves)."""
    s, _ = _scheduler()
    s.finish(_prefilled(s, "a", 80), "stop")
    assert s.radix is not None and s.windows is not None
    hit = s.radix.match_prefix(list(range(80)), max_blocks=19)
    taker = _seq("b", 80)
    s.windows.restore(taker, hit.window, 76)
    assert s.radix.drop_slabs(100) == 17  # all but the two the taker holds
    s.windows.release(taker)
    assert s.radix.match_prefix(list(range(80)), max_blocks=19).num_blocks == 19
    s.check_invariants()


def test_a_prompt_that_fits_alone_starts_over_when_its_hit_pins_the_room() -> None:
    """Nothing runs; the budget is all arrays, grown for a cached prompt whose blocks a longer
    repeat would hit: those blocks are locked by the hit, so the arrays cannot shrink below
    them and the repeat's new blocks have no room. The cache goes, the arrays shrink, and the
    repeat is computed from scratch (which fits alone)."""
    s, budget = _scheduler()
    assert s.pool is not None and s.windows is not None

    def reclaim() -> bool:  # as the runner's arrays shrink to the ids in use
        for ids in (s.pool, s.windows.pool):  # type: ignore[union-attr]
            ids.set_capacity(ids.highest_used() + 1)
        return True

    s.reclaim = reclaim
    s.finish(_prefilled(s, "a", 80), "stop")
    budget.total = budget.used
    longer = _seq("b", 120)
    s.add(longer)
    assert _prefill_step(s) and longer in s.prefilling + s.running
    assert longer.num_cached == 0  # from scratch: the hit's blocks went with the cache


def test_blocks_grow_into_what_the_slabs_do_not_need() -> None:
    """The slab arrays have free room for a prompt's first chunk, the budget 5 bytes for the
    block arrays to grow by: admission takes them (it kept the slabs' bytes aside, which they
    did not need, and the block arrays could not grow: the worker stopped on an assertion)."""
    s, budget = _scheduler()
    s.finish(_prefilled(s, "a", 80), "stop")
    s.flush_prefix_cache()
    budget.total = budget.used + 5  # block arrays at 20, slab arrays at 19, all free
    longer = _seq("b", 100)
    longer.prompt_ids = [7] * 100
    s.add(longer)
    assert _prefill_step(s) and longer in s.prefilling
    assert s.pool is not None and s.pool.capacity == 25
