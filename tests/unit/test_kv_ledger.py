"""``KVLedger`` alone, on a real ``BlockPool``: a prompt admitted with its cached prefix, a
decode step's block, the victim to preempt, blocks freed into the prefix cache or not, draft
room, and a windowed model's slabs. The pool's invariants (free + used == total) hold after
every call. The scheduler's use of it is in test_scheduler.py and test_slab_accounting.py."""

from __future__ import annotations

from mlxd.protocol.messages import SamplingParams
from mlxd.worker.kv.block_pool import BlockPool, KVBudget
from mlxd.worker.kv.window_slabs import WindowSlabs
from mlxd.worker.sched.kv_ledger import KVLedger
from mlxd.worker.sched.sequence import PRIORITY_LEVELS, Sequence

BS = 4
CHUNK = 16  # a prefill chunk's tokens


def _seq(rid: str, tokens: list[int], priority: str = "normal", at: float = 0.0) -> Sequence:
    return Sequence(
        request_id=rid,
        client=b"c",
        prompt_ids=tokens,
        sampling=SamplingParams(),
        max_tokens=8,
        priority=PRIORITY_LEVELS[priority],
        arrival=at,
    )


def _check(kv: KVLedger, live: list[Sequence], waiting: list[Sequence] | None = None) -> None:
    pool = kv.pool
    if pool.budget is None:
        assert pool.num_free + pool.num_used == pool.num_blocks
    kv.check_invariants(live, waiting or [])


def _admit(kv: KVLedger, seq: Sequence, live: list[Sequence]) -> bool:
    admitted = kv.admit(seq, CHUNK, [], alone=not live)
    if admitted:
        live.append(seq)
    _check(kv, live)
    return admitted


def _prefilled(kv: KVLedger, seq: Sequence, live: list[Sequence]) -> None:
    """Admitted and its prompt computed, as the runner leaves it (the last token's K/V is
    written by the first decode step)."""
    assert _admit(kv, seq, live)
    seq.num_prefilled = seq.num_prefill_tokens
    seq.num_computed = seq.num_prefill_tokens - 1
    kv.index_prompt(seq)
    _check(kv, live)


def _free(kv: KVLedger, seq: Sequence, live: list[Sequence], cache: bool = True) -> None:
    kv.free(seq, cache)
    live.remove(seq)
    _check(kv, live)


def test_admit_takes_a_prompts_blocks_and_free_keeps_its_full_ones_cached() -> None:
    kv, live = KVLedger(BlockPool(16, BS)), []
    seq = _seq("a", list(range(10)))
    assert _admit(kv, seq, live)
    assert len(seq.block_ids) == 3 and (seq.num_computed, seq.num_cached) == (0, 0)
    seq.num_computed = 10
    _free(kv, seq, live)
    assert seq.block_ids == [] and kv.pool.num_used == kv.radix.num_cached_blocks == 2


def test_a_later_prompt_shares_the_cached_prefix_and_computes_at_least_one_token() -> None:
    kv, live = KVLedger(BlockPool(16, BS)), []
    first = _seq("a", list(range(12)))
    _prefilled(kv, first, live)
    again = _seq("b", list(range(12)))
    assert _admit(kv, again, live)
    # 3 blocks cached, 2 shared: the last block holds the token whose logits come next
    assert again.num_cached == again.num_computed == again.num_prefilled == 8
    assert again.block_ids[:2] == first.block_ids[:2] and again.block_ids[2] != first.block_ids[2]
    assert all(kv.pool.ref_count(b) >= 2 for b in again.block_ids[:2])
    _free(kv, first, live)
    _free(kv, again, live, cache=False)
    assert kv.flush() == 3 and kv.pool.num_used == 0
    _check(kv, live)


def test_a_resumed_sequence_s_own_blocks_are_not_a_cache_hit() -> None:
    kv, live = KVLedger(BlockPool(16, BS)), []
    seq = _seq("a", list(range(12)))
    _prefilled(kv, seq, live)
    _free(kv, seq, live)  # preempted: its known blocks stay cached
    seq.num_preemptions = 1
    assert _admit(kv, seq, live)
    assert (seq.num_computed, seq.num_cached) == (8, 0)


def test_admit_that_does_not_fit_takes_nothing() -> None:
    kv, live = KVLedger(BlockPool(4, BS)), []
    assert _admit(kv, _seq("a", list(range(12))), live)
    late = _seq("b", list(range(100, 112)))
    assert not _admit(kv, late, live)
    assert late.block_ids == [] and late.prefix_node is None and kv.pool.num_used == 3


def test_grow_takes_a_block_only_when_the_last_is_full() -> None:
    kv, live = KVLedger(BlockPool(8, BS)), []
    seq = _seq("a", list(range(8)))
    _prefilled(kv, seq, live)  # 7 computed: the 8th token still fits block 1
    assert kv.grow(seq) and len(seq.block_ids) == 2
    _check(kv, live)
    seq.num_computed = 8
    assert kv.grow(seq) and len(seq.block_ids) == 3
    _check(kv, live)


def test_grow_evicts_cached_blocks_then_says_no() -> None:
    kv, live = KVLedger(BlockPool(4, BS)), []
    old = _seq("a", list(range(8)))
    _prefilled(kv, old, live)
    old.num_computed = 8
    _free(kv, old, live)  # two cached blocks
    seq = _seq("b", list(range(100, 108)))
    _prefilled(kv, seq, live)
    for computed in (8, 12):  # each new block evicts a cached one
        seq.num_computed = computed
        assert kv.grow(seq)
        _check(kv, live)
    assert kv.radix.match_prefix(list(range(8))).num_blocks == 0 and len(seq.block_ids) == 4
    seq.num_computed = 16
    assert not kv.grow(seq) and len(seq.block_ids) == 4
    _check(kv, live)


def test_the_victim_is_the_lowest_priority_then_the_latest() -> None:
    early_low = _seq("a", [1], "low", at=1.0)
    late_low = _seq("b", [1], "low", at=2.0)
    high = _seq("c", [1], "high", at=3.0)
    assert KVLedger.victim([early_low, high, late_low]) is late_low
    assert KVLedger.victim([high, early_low]) is early_low


def test_free_without_cache_returns_every_block() -> None:
    """A failed step's blocks (``requeue``): none goes to the prefix cache."""
    kv, live = KVLedger(BlockPool(8, BS)), []
    seq = _seq("a", list(range(10)))
    assert _admit(kv, seq, live)
    seq.num_computed = 8
    _free(kv, seq, live, cache=False)
    assert kv.pool.num_used == 0 and seq.num_computed == 0


def test_drafts_take_free_blocks_only_and_trim_gives_them_back() -> None:
    kv, live = KVLedger(BlockPool(4, BS)), []
    seq = _seq("a", list(range(5)))
    _prefilled(kv, seq, live)  # 4 computed, 2 blocks
    assert kv.reserve_drafts(seq, 6) == 6 and len(seq.block_ids) == 3  # tokens 4..10
    _check(kv, live)
    assert kv.reserve_drafts(seq, 20) == 11 and len(seq.block_ids) == 4  # the pool's last
    _check(kv, live)
    seq.num_computed = 6  # two drafts accepted
    kv.trim(seq)
    assert len(seq.block_ids) == 2 and kv.pool.num_used == 2
    _check(kv, live)


def _windowed() -> KVLedger:
    budget = KVBudget(400)
    kv = KVLedger(BlockPool(200, BS, budget, 1))
    kv.keep_windows(WindowSlabs(BlockPool(200, BS, budget, 1), 8, 4), reclaim=None)
    return kv


def test_a_windowed_prompt_takes_slabs_a_chunk_ahead_and_gives_them_all_back() -> None:
    kv, live = _windowed(), []
    assert kv.windows is not None
    seq = _seq("a", list(range(40)))
    assert _admit(kv, seq, live)
    assert len(seq.block_ids) == 10 and seq.window_ids == [0, 1, 2, 3]  # the first chunk's
    assert kv.window_room(seq, 32) == 32 and len(seq.window_ids) == 8
    _check(kv, live)
    seq.num_computed = 32
    kv.drop_behind([seq])  # blocks ending before 32 - 8 - 4 go back
    assert seq.window_ids[:5] == [-1] * 5 and min(seq.window_ids[5:]) >= 0
    _check(kv, live)
    _free(kv, seq, live, cache=False)
    assert (kv.pool.num_used, kv.windows.pool.num_used) == (0, 0)


def test_cached_blocks_go_before_the_arrays_grow_past_twice_the_load() -> None:
    """Memory follows the load: with the arrays holding 4 ids, twice the 2 blocks a sequence
    has held, a new prompt takes the ids a finished one left cached, not ids past the arrays;
    they grow only for what no cached block can give (run S1: the cache had grown a soak's
    pool toward its whole budget)."""
    held = 4
    kv, live = KVLedger(BlockPool(64, BS, held=lambda: held)), []
    for start in (0, 50):  # two prompts of 2 blocks each, cached when they end
        done = _seq(f"a{start}", list(range(start, start + 8)))
        _prefilled(kv, done, live)
        _free(kv, done, live)
    assert kv.radix.num_cached_blocks == 4
    second = _seq("b", list(range(100, 108)))
    _prefilled(kv, second, live)
    assert max(second.block_ids) < held
    assert kv.radix.match_prefix(list(range(8)) + [9]).num_blocks == 0  # the first's went
    third = _seq("c", list(range(200, 208)))  # the eviction took 16 at most: both went
    _prefilled(kv, third, live)
    assert max(third.block_ids) < held
    fourth = _seq("d", list(range(300, 308)))  # nothing cached left: the arrays grow
    _prefilled(kv, fourth, live)
    assert min(fourth.block_ids) >= held


def test_below_twice_the_load_a_conversation_keeps_its_prefix_through_another() -> None:
    """An agent's context stays cached while a sub-agent takes its turn: the arrays (3 ids)
    hold less than twice the load's peak (2 blocks), so they grow rather than evict it."""
    kv, live = KVLedger(BlockPool(64, BS, held=lambda: 3)), []
    first = _seq("a", list(range(8)))
    _prefilled(kv, first, live)
    _free(kv, first, live)
    _prefilled(kv, _seq("b", list(range(100, 108))), live)
    assert kv.radix.match_prefix(list(range(8)) + [9]).num_blocks == 2


def test_the_arrays_grow_to_twice_the_load_s_peak_at_once() -> None:
    """While the load sets its peak, the arrays take twice it in one growth (``reserve``), so
    the memory steps up with the load and the cache then fills room already there."""
    held, asked = [2], []

    def reserve(n: int) -> None:
        asked.append(n)
        held[0] = n

    kv, live = KVLedger(BlockPool(64, BS, held=lambda: held[0], reserve=reserve)), []
    first = _seq("a", list(range(8)))
    _prefilled(kv, first, live)
    _free(kv, first, live)
    _prefilled(kv, _seq("b", list(range(100, 108))), live)  # peak 2 blocks: arrays of 4
    assert asked == [4] and kv.radix.match_prefix(list(range(8)) + [9]).num_blocks == 2
    _prefilled(kv, _seq("c", list(range(200, 208))), live)  # b and c in flight: 8
    assert asked == [4, 8]
