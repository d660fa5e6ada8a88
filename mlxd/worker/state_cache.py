"""Recurrent state of state-space layers (Mamba-style) in the contiguous runner's batch.

Such a layer keeps no K/V but a fixed-size state per sequence (conv and SSM state), in
mlx-lm's ``ArraysCache``, which batches by rows: ``filter`` and ``extend`` are row operations.
Two gaps are filled here: extending an empty batch (``ArraysCache`` would count it as one
row) and filtering to no rows. Prompts of such models are prefilled one sequence at a time:
a left-padded row would run its padding through the recurrence, and not every model masks it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def is_state_cache(cache: Any) -> bool:
    from mlx_lm.models.cache import ArraysCache

    return isinstance(cache, ArraysCache)


def is_empty(cache: Any) -> bool:
    return all(c is None for c in cache.cache)


def extend(batch: Any, part: Any) -> Any:
    """``batch`` with ``part``'s rows appended (``part`` itself when ``batch`` has none)."""
    if is_empty(batch):
        return part
    batch.extend(part)
    return batch


def keep_rows(cache: Any, keep: list[int]) -> Any:
    """``cache`` with only the rows ``keep``, in that order (a fresh one when none)."""
    if not keep:
        return type(cache)(len(cache.cache))
    cache.filter(mx.array(keep))
    return cache


def nbytes(cache: Any) -> int:
    return sum(c.nbytes for c in cache.cache if c is not None)
