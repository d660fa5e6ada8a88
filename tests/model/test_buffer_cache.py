"""MLX's cache of freed buffers in a worker (``worker.buffer_cache``): a cap that lowers MLX's
limit and never raises it, and the limit in force read without changing it."""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import pytest

from mlxd.worker.buffer_cache import cap, limit_in_force

pytestmark = pytest.mark.model

LIMIT = 4 * 2**20  # bytes: below MLX's own 32 MiB on the CPU, so ``cap`` takes it


@pytest.fixture
def capped() -> Iterator[int]:
    mx.clear_cache()
    default = mx.set_cache_limit(LIMIT)
    try:
        yield LIMIT
    finally:
        mx.set_cache_limit(default)
        mx.clear_cache()


def test_the_limit_in_force_is_read_and_left_as_it_was(capped: int) -> None:
    assert limit_in_force() == capped and limit_in_force() == capped
    assert cap(2 * capped) == capped  # never raised by a cap: lowered only
    assert cap(capped // 2) == capped // 2 == limit_in_force()
