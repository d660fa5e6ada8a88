"""A model's own layer caches, exactly as its ``make_cache()`` lays them out, batched by row.

Models whose layers are not one plain K/V cache each (sliding windows, recurrent state, hybrids,
shared-KV or cache-less layers, cache lists, MLA) get their caches from mlx-lm itself: the list
``make_cache()`` returns, in its length and kinds, never one per layer by assumption (Gemma 4's
shared-KV layers and Nemotron-H's MLP layers have none). A sequence prefills into its own list;
when its prompt is done each entry joins the decode batch through mlx-lm's ``merge`` (one
sequence -> ``BatchKVCache``, ``BatchRotatingKVCache``, ``ArraysCache`` rows, ``CacheList`` of
those) and ``extend``; rows leave through ``filter``. A cache kind with no ``merge`` cannot
batch: such a model decodes one sequence at a time (``is_batchable``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

# Kinds whose only state is K/V of every past token: the paged pool holds these.
_PLAIN = ("KVCache",)


def model_caches(model: Any) -> list[Any]:
    """A fresh cache list for one sequence, as the model lays it out."""
    if hasattr(model, "make_cache"):
        return list(model.make_cache())
    from mlx_lm.models.cache import KVCache

    return [KVCache() for _ in model.layers]


def kinds(caches: list[Any]) -> list[str]:
    """The kind of each entry, a cache list as ``CacheList(A, B)``."""
    return [_kind(c) for c in caches]


def is_plain(model: Any) -> bool:
    """One plain K/V cache per layer: the paged pool and our own contiguous caches fit."""
    caches = model_caches(model)
    return len(caches) == len(model.layers) and all(k in _PLAIN for k in kinds(caches))


def is_batchable(model: Any) -> bool:
    """Whether every entry can join a batch (mlx-lm's ``merge``)."""
    return all(_batchable(c) for c in model_caches(model))


def to_batch(caches: list[Any]) -> list[Any]:
    """One prefilled sequence's caches as a batch of one row (itself if it cannot batch)."""
    return [type(c).merge([c]) if _batchable(c) else c for c in caches]


def extend(batch: list[Any], part: list[Any]) -> list[Any]:
    """``batch`` with ``part``'s rows appended (``part`` itself when ``batch`` has none)."""
    if not batch:
        return part
    for mine, theirs in zip(batch, part, strict=True):
        mine.extend(theirs)
    return batch


def keep_rows(batch: list[Any], keep: list[int]) -> list[Any]:
    """``batch`` with only the rows ``keep``, in that order (empty when none)."""
    if not keep:
        return []
    idx = mx.array(keep)
    for cache in batch:
        cache.filter(idx)
    return batch


def nbytes(caches: list[Any]) -> int:
    return sum(a.nbytes for a in arrays(caches))


def arrays(caches: list[Any]) -> list[mx.array]:
    """Every array the caches hold (to evaluate them)."""
    return [a for c in caches for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]


def _kind(cache: Any) -> str:
    if hasattr(cache, "caches"):
        return f"{type(cache).__name__}({', '.join(_kind(c) for c in cache.caches)})"
    return type(cache).__name__


def _batchable(cache: Any) -> bool:
    if hasattr(cache, "caches"):
        return hasattr(type(cache), "merge") and all(_batchable(c) for c in cache.caches)
    return hasattr(type(cache), "merge")
