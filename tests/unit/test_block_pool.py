"""BlockPool: allocation, reference counts and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxd.worker.kv.block_pool import BlockPool


def test_allocate_retain_release() -> None:
    pool = BlockPool(num_blocks=4, block_size=8)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free == 1 and pool.num_used == 3
    pool.retain(a[:1])
    assert pool.release(a) == 2  # a[0] still has one reference
    assert pool.ref_count(a[0]) == 1 and pool.num_free == 3
    assert pool.release(a[:1]) == 1 and pool.num_free == 4
    pool.check_invariants()


def test_allocate_more_than_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(num_blocks=2, block_size=8)
    pool.allocate(1)
    assert not pool.can_allocate(2)
    with pytest.raises(MemoryError):
        pool.allocate(2)
    assert pool.num_free == 1
    pool.check_invariants()


def test_release_of_a_free_block_is_a_broken_invariant() -> None:
    pool = BlockPool(num_blocks=2, block_size=8)
    (b,) = pool.allocate(1)
    pool.release([b])
    with pytest.raises(AssertionError):
        pool.release([b])


def test_blocks_for_rounds_up() -> None:
    pool = BlockPool(num_blocks=2, block_size=4)
    assert [pool.blocks_for(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


@given(st.lists(st.tuples(st.sampled_from(["alloc", "retain", "release"]), st.integers(0, 20))))
def test_invariants_hold_for_any_sequence_of_operations(ops: list[tuple[str, int]]) -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    held: list[int] = []  # one entry per reference we hold
    for op, n in ops:
        if op == "alloc" and pool.can_allocate(n % 4):
            held += pool.allocate(n % 4)
        elif op == "retain" and held:
            pool.retain([held[n % len(held)]])
            held.append(held[n % len(held)])
        elif op == "release" and held:
            pool.release([held.pop(n % len(held))])
        pool.check_invariants()
        assert pool.num_used == len(set(held))
        assert all(pool.ref_count(b) == held.count(b) for b in set(held))


def test_the_lowest_free_ids_go_first_so_blocks_in_use_stay_packed() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    a = pool.allocate(6)
    assert a == [0, 1, 2, 3, 4, 5] and pool.highest_used() == 5
    pool.release([a[1], a[4], a[5]])
    assert pool.highest_used() == 3
    assert pool.allocate(2) == [1, 4]  # not 6 and 7: the pool's arrays need not grow
    pool.release(pool.allocate(0) + [0, 1, 2, 3, 4])
    assert pool.highest_used() == -1
    pool.check_invariants()
