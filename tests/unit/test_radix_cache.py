"""RadixCache: prefix matching over whole blocks, sharing, locking and LRU eviction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.prefix.radix_cache import STATE_EVERY, RadixCache, state_cuts

BS = 4


def _cache(num_blocks: int = 16) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(num_blocks=num_blocks, block_size=BS)
    return pool, RadixCache(pool)


def _store(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> list[int]:
    """A sequence that computed ``tokens`` and finished: its full blocks go to the cache."""
    ids = pool.allocate(pool.blocks_for(len(tokens)))
    cache.insert(tokens, ids)
    pool.release(ids)
    return ids


def test_match_returns_whole_blocks_only() -> None:
    pool, cache = _cache()
    ids = _store(pool, cache, list(range(10)))  # two full blocks + a partial one
    assert cache.num_cached_blocks == 2
    assert pool.num_used == 2  # the partial block was not kept
    m = cache.match_prefix(list(range(11)))
    assert m.block_ids == ids[:2]
    assert cache.match_prefix(list(range(7))).block_ids == ids[:1]
    assert cache.match_prefix([1, 2, 3, 4, 5]).block_ids == []
    assert cache.match_prefix(list(range(11)), max_blocks=1).block_ids == ids[:1]


def test_insert_keeps_the_cached_copy_of_a_known_prefix() -> None:
    pool, cache = _cache()
    first = _store(pool, cache, list(range(8)))
    dup = pool.allocate(2)
    assert cache.insert(list(range(8)), dup) == 2
    assert pool.ref_count(dup[0]) == 1  # still only the caller's
    assert cache.match_prefix(list(range(8))).block_ids == first
    cache.check_invariants()


def test_shared_prefix_is_held_once() -> None:
    pool, cache = _cache()
    shared = _store(pool, cache, list(range(8)) + [100, 101, 102, 103])
    _store(pool, cache, list(range(8)) + [200, 201, 202, 203])
    assert cache.num_cached_blocks == 4  # 2 shared + 1 + 1
    m = cache.match_prefix(list(range(8)) + [200, 201, 202, 203])
    assert m.block_ids[:2] == shared[:2]


def test_evict_lru_leaves_and_never_locked_or_referenced_blocks() -> None:
    pool, cache = _cache(num_blocks=6)
    _store(pool, cache, [1] * 8)  # oldest
    _store(pool, cache, [2] * 8)
    _store(pool, cache, [3] * 8)  # newest
    locked = cache.match_prefix([2] * 8)  # touches [2]: now the newest
    cache.lock(locked.node)
    held = cache.match_prefix([3] * 4)  # a sequence references [3]'s first block
    pool.retain(held.block_ids)
    assert cache.num_evictable == 3  # [1] x2 and [3]'s second block
    assert cache.evict(2) == 2
    assert cache.match_prefix([1] * 8).block_ids == []  # the least recent went first
    assert cache.evict(10) == 1  # [3]'s second block; [2] locked, [3][0] referenced
    assert cache.match_prefix([2] * 8).num_blocks == 2
    assert cache.match_prefix([3] * 8).num_blocks == 1
    cache.unlock(locked.node)
    pool.release(held.block_ids)
    assert cache.evict(10) == 3
    assert pool.num_free == 6 and cache.num_cached_blocks == 0
    cache.check_invariants()
    pool.check_invariants()


# A randomized schedule: sequences over a 2-token alphabet (so prefixes collide) are admitted
# (match, lock, allocate the rest, evicting when short), finish (insert, unlock, release) or
# the cache evicts. After every step the invariants hold and no live sequence lost a block.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "finish", "evict"]),
        st.lists(st.integers(0, 1), min_size=1, max_size=14),
        st.integers(0, 30),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_invariants_hold_after_every_step_of_a_random_schedule(
    ops: list[tuple[str, list[int], int]],
) -> None:
    pool, cache = _cache(num_blocks=10)
    live: list[tuple[list[int], list[int], object]] = []  # tokens, block table, locked node
    for op, tokens, n in ops:
        if op == "admit":
            m = cache.match_prefix(tokens, max_blocks=(len(tokens) - 1) // BS)
            cache.lock(m.node)
            need = pool.blocks_for(len(tokens)) - m.num_blocks
            if pool.num_free < need:
                cache.evict(need - pool.num_free)
            if pool.num_free < need:
                cache.unlock(m.node)
            else:
                pool.retain(m.block_ids)
                live.append((tokens, m.block_ids + pool.allocate(need), m.node))
        elif op == "finish" and live:
            tokens, table, node = live.pop(n % len(live))
            cache.insert(tokens, table)
            cache.unlock(node)  # type: ignore[arg-type]
            pool.release(table)
        elif op == "evict":
            cache.evict(n)
        pool.check_invariants()
        cache.check_invariants()
        in_use = [b for _, table, _ in live for b in table]
        assert all(pool.ref_count(b) >= in_use.count(b) for b in in_use)
        assert pool.num_used == len(set(in_use) | {b for b in _cached(cache)})


def _cached(cache: RadixCache) -> list[int]:
    return [n.block_id for n in cache._nodes()]


def test_evict_from_frees_blocks_from_an_id_up_and_what_follows_them() -> None:
    pool, cache = _cache()
    _store(pool, cache, list(range(12)))  # blocks 0, 1, 2
    _store(pool, cache, [100 + t for t in range(12)])  # blocks 3, 4, 5 (4's child is 5)
    assert cache.evict_from(4) == 2
    assert cache.match_prefix([100 + t for t in range(12)]).block_ids == [3]
    assert cache.match_prefix(list(range(12))).num_blocks == 3
    assert pool.highest_used() == 3
    cache.check_invariants()
    pool.check_invariants()


def test_evict_from_keeps_locked_blocks() -> None:
    pool, cache = _cache()
    _store(pool, cache, list(range(12)))
    match = cache.match_prefix(list(range(8)))  # blocks 0 and 1: a running sequence's prefix
    cache.lock(match.node)
    assert cache.evict_from(1) == 1  # block 2 only
    assert pool.highest_used() == 1
    cache.unlock(match.node)
    cache.check_invariants()


class _State:
    """A hybrid's recurrent state, as the radix cache sees one: opaque but for its size."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_with_states_a_match_ends_at_the_deepest_node_holding_one() -> None:
    pool, cache = _cache()
    cache.keep_states(100)
    tokens = list(range(16))
    ids = pool.allocate(4)
    cache.insert(tokens, ids, {4: _State(10), 12: _State(10)})
    m = cache.match_prefix(tokens + [99])
    assert (m.block_ids, m.shared_blocks, m.node.state.nbytes) == (ids[:3], 4, 10)
    assert cache.match_prefix(tokens[:11] + [99]).block_ids == ids[:1]  # parts before 12
    assert cache.match_prefix([7] + tokens[1:]).block_ids == []
    cache.check_invariants()


def test_states_stay_within_their_budget_least_recently_used_first_and_go_with_their_node() -> None:
    pool, cache = _cache()
    cache.keep_states(25)
    a, b, c = [list(range(k, k + 8)) for k in (0, 100, 200)]

    def store(tokens: list[int]) -> None:  # a finished sequence's blocks and state
        ids = pool.allocate(2)
        cache.insert(tokens, ids, {8: _State(10)})
        pool.release(ids)

    store(a)
    store(b)
    cache.match_prefix(a + [1])  # a is used again: b is the least recently used
    store(c)
    assert cache.state_bytes == 20
    assert cache.match_prefix(b + [1]).block_ids == []  # its state went, its blocks stay
    assert cache.match_prefix(a + [1]).shared_blocks == 2
    cache.evict(cache.num_cached_blocks)  # nodes go, and their states with them
    assert cache.state_bytes == 0
    cache.check_invariants()


def test_states_stay_within_the_room_the_runner_gives_them_now() -> None:
    """A hybrid's snapshots follow its pool (``room``): with room for two states of a budget
    of ten, a third pushes the least recent out; with more room, they stay."""
    pool, cache = _cache()
    room = [20]
    cache.keep_states(100, lambda: room[0])
    for k in range(3):
        ids = pool.allocate(2)
        cache.insert(list(range(100 * k, 100 * k + 8)), ids, {8: _State(10)})
        pool.release(ids)
    assert cache.state_bytes == 20 and cache.match_prefix(list(range(9))).block_ids == []
    room[0] = 100
    ids = pool.allocate(2)
    cache.insert(list(range(300, 308)), ids, {8: _State(10)})
    assert cache.state_bytes == 30
    cache.check_invariants()


def test_a_state_larger_than_the_budget_is_not_kept() -> None:
    pool, cache = _cache()
    cache.keep_states(5)
    cache.insert(list(range(8)), pool.allocate(2), {8: _State(10)})
    assert cache.state_bytes == 0
    assert cache.match_prefix(list(range(9))).block_ids == []


def test_state_cuts_leave_out_a_periodic_cut_near_another() -> None:
    """A hybrid runs a forward per span between cuts: a periodic cut within a quarter period of
    the last block boundary or an asked cut is left out; one farther away is kept."""
    every, block = STATE_EVERY, 32
    # a 2,139-token prompt: its last block boundary (2,112) is 64 tokens after the period's 2,048
    assert state_cuts(block, 2139, set(), 0, 2138) == {every, 2112}
    # the same prompt after a hit asked at 1,984: 1,984 -> 2,112 is one span, not two
    assert state_cuts(block, 2139, {1984}, 1984, 2138) == {2112}
    # far from both: kept
    assert state_cuts(block, 3000, {1500}, 0, 2999) == {every, 1500, 2 * every, 2976}
