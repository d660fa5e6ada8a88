"""MLX's cache of freed buffers in a worker (``worker.buffer_cache``): MLX takes no freed buffer
into a full cache, so the engine empties a cache that stale buffers filled, and the steps' own
buffers are cached again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxd.worker.buffer_cache import CacheSweep, cap, limit_in_force
from tests.model.conftest import Harness

pytestmark = pytest.mark.model

LIMIT = 4 * 2**20  # bytes: below MLX's own 32 MiB on the CPU, so ``cap`` takes it
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 4


@pytest.fixture
def capped() -> Iterator[int]:
    mx.clear_cache()
    default = mx.set_cache_limit(LIMIT)
    try:
        yield LIMIT
    finally:
        mx.set_cache_limit(default)
        mx.clear_cache()


def freed(num_bytes: int) -> None:
    """Make an array of ``num_bytes`` and let it go: its buffer is freed (into the cache)."""
    a = mx.arange(num_bytes // 4, dtype=mx.float32)  # one buffer
    mx.eval(a)
    del a


def fill(limit: int) -> None:
    """Fill the cache to within 16 KiB of ``limit`` with one buffer no step asks for."""
    freed(limit - 16 * 1024)
    assert mx.get_cache_memory() >= limit - 16 * 1024


def takes_a_freed_buffer() -> bool:
    before = mx.get_cache_memory()
    freed(64 * 1024)
    return mx.get_cache_memory() > before


def test_a_full_cache_takes_no_freed_buffer_until_emptied(capped: int) -> None:
    """MLX's own behaviour, the reason for the sweep: once full, always full."""
    fill(capped)
    assert not takes_a_freed_buffer()
    assert not takes_a_freed_buffer()  # and nothing it holds goes by itself
    mx.clear_cache()
    assert takes_a_freed_buffer()


def test_the_limit_in_force_is_read_and_left_as_it_was(capped: int) -> None:
    assert limit_in_force() == capped and limit_in_force() == capped
    assert cap(2 * capped) == capped  # never raised by a cap: lowered only
    assert cap(capped // 2) == capped // 2 == limit_in_force()


def test_a_sweep_empties_a_full_cache_at_most_once_in_min_steps(capped: int) -> None:
    sweep = CacheSweep(min_steps=3)
    assert sweep.limit == capped
    assert not sweep.tick()  # not full
    fill(capped)
    assert sweep.tick() and mx.get_cache_memory() == 0
    fill(capped)
    assert [sweep.tick() for _ in range(3)] == [False, False, True]
    assert sweep.sweeps == 2


def test_an_engine_whose_cache_stale_buffers_filled_caches_its_steps_again(
    capped: int, harness_factory: Any
) -> None:
    h: Harness = harness_factory(prefill_chunk=64)
    assert h.engine.cache_sweep.limit == capped
    fill(capped)  # as loading, warm-up or a long prompt leave it
    result = h.run_alone("a", PROMPT, max_tokens=8)
    assert result.finished is not None
    assert h.engine.cache_sweep.sweeps == 1
    assert takes_a_freed_buffer()


def test_the_workers_status_counts_the_sweeps(
    capped: int, harness_factory: Any, tiny_model: Path
) -> None:
    from mlxd.protocol.messages import GetStatus, StatusReply
    from tests.model.test_control import Admin

    admin = Admin(harness_factory(prefill_chunk=64), tiny_model)
    try:
        fill(capped)
        admin.h.run_alone("a", PROMPT, max_tokens=8)
        status = admin.ask(GetStatus(request_id="s"))
        assert isinstance(status, StatusReply)
        assert status.memory.cache_sweeps == 1
    finally:
        admin.close()
