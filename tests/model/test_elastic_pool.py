"""The elastic KV pool (issue 21 point 1): arrays that grow in chunks as blocks are written and
shrink when the worker is idle, with outputs unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.model.test_engine import reference_ids

pytestmark = pytest.mark.model

CHUNK = 4  # blocks of 16 tokens: a 200-token prompt needs four chunks


def _prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 13 * j) % 250 + 1 for j in range(length)] for i in range(n)]


def test_a_grown_pool_gives_mlx_lm_greedy_tokens(harness_factory: Any, tiny_model: Path) -> None:
    h = harness_factory(chunk_blocks=CHUNK, block_size=16, num_blocks=256)
    pool = h.engine.runner.pool
    assert pool.capacity == CHUNK
    prompts = _prompts(4, 200)
    for i, ids in enumerate(prompts):
        h.generate_ids(f"r{i}", ids, max_tokens=40, ignore_eos=True)
    results = h.run()
    for i, ids in enumerate(prompts):
        assert results[f"r{i}"].token_ids == reference_ids(tiny_model, ids, 40), i
    used = h.engine.scheduler.pool.highest_used() + 1
    assert CHUNK < pool.capacity < 256  # it grew, as far as the blocks written and no further
    assert pool.capacity >= used


def test_pool_grows_while_streams_run_and_they_stay_exact(
    harness_factory: Any, tiny_model: Path
) -> None:
    h = harness_factory(chunk_blocks=CHUNK, block_size=16, num_blocks=256, prefill_chunk=64)
    short, long = _prompts(2, 20)[0], _prompts(3, 300)[2]
    h.generate_ids("short", short, max_tokens=60, ignore_eos=True)
    h.step(5)  # decoding from the first chunk
    before = h.engine.runner.pool.capacity
    h.generate_ids("long", long, max_tokens=10, ignore_eos=True)
    results = h.run()
    assert h.engine.runner.pool.capacity > before
    assert results["short"].token_ids == reference_ids(tiny_model, short, 60)
    assert results["long"].token_ids == reference_ids(tiny_model, long, 10)


def test_idle_release_shrinks_the_pool_to_a_chunk_and_frees_memory(
    harness_factory: Any, tiny_model: Path
) -> None:
    import mlx.core as mx

    from mlxd.worker.idle_release import IdleRelease

    now = [0.0]
    h = harness_factory(chunk_blocks=CHUNK, block_size=16, num_blocks=256)
    h.engine.idle_release = release = IdleRelease(5.0, clock=lambda: now[0])
    mx.clear_cache()
    start = mx.get_active_memory()
    prompts = _prompts(6, 250)
    for i, ids in enumerate(prompts):
        h.generate_ids(f"r{i}", ids, max_tokens=20, ignore_eos=True)
    h.run()
    runner, sched = h.engine.runner, h.engine.scheduler
    grown = runner.kv_reserved_bytes
    assert runner.pool.capacity > 4 * CHUNK and sched.radix.num_cached_blocks > CHUNK
    assert not release.idle(runner, sched)  # idle from now
    now[0] = 4.9
    assert not release.idle(runner, sched)
    now[0] = 5.0
    assert release.idle(runner, sched)
    assert runner.pool.capacity == CHUNK and runner.kv_reserved_bytes < grown / 4
    assert 0 < sched.radix.num_cached_blocks <= CHUNK  # the first chunk's prefix blocks stay
    sched.check_invariants()
    assert mx.get_cache_memory() == 0
    # back to what it held before the burst (its pool was one chunk then too), within 1/16 of
    # what the burst added: a shrink that kept the old arrays' buffers would hold all of it
    assert mx.get_active_memory() - start <= grown // 16
    again = _prompts(7, 250)[6]
    h.generate_ids("again", again, max_tokens=20, ignore_eos=True)
    assert h.run()["again"].token_ids == reference_ids(tiny_model, again, 20)


def test_growth_stops_at_the_budget_and_preemption_works_as_before(
    harness_factory: Any, tiny_model: Path
) -> None:
    h = harness_factory(chunk_blocks=CHUNK, block_size=16, num_blocks=40)
    prompts = _prompts(4, 150)  # 10 blocks each, 40 in all, and each grows past that
    for i, ids in enumerate(prompts):
        h.generate_ids(f"r{i}", ids, max_tokens=40, ignore_eos=True)
    results = h.run()
    assert h.engine.runner.pool.capacity == 40
    assert h.engine.scheduler.counters.preemptions > 0
    for i, ids in enumerate(prompts):
        assert results[f"r{i}"].token_ids == reference_ids(tiny_model, ids, 40), i
