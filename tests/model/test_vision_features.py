"""The vision tower's feature cache: each image's features by digest, least recently used out
within a byte bound, and a prompt served from it only when all its images are there."""

from __future__ import annotations

import mlx.core as mx
import pytest

pytestmark = pytest.mark.model

FEATURES = 64 * 32 * 4  # bytes of one image's (64, 32) float32 features


def _features(value: float) -> mx.array:
    return mx.full((64, 32), value, dtype=mx.float32)


def test_all_or_nothing_in_the_prompts_order() -> None:
    from mlxd.worker.vision.encoder import FeatureCache

    cache = FeatureCache(max_bytes=4 * FEATURES)
    cache.put("a", _features(1))
    cache.put("b", _features(2))
    got = cache.get(["b", "a"])
    assert got is not None and [float(f[0, 0]) for f in got] == [2.0, 1.0]
    assert cache.get(["a", "c"]) is None  # one missing image: the tower runs for the prompt


def test_least_recently_used_goes_first_within_the_bound() -> None:
    from mlxd.worker.vision.encoder import FeatureCache

    cache = FeatureCache(max_bytes=2 * FEATURES)
    cache.put("a", _features(1))
    cache.put("b", _features(2))
    assert cache.get(["a"]) is not None  # a is used again: b is now the oldest
    cache.put("c", _features(3))
    assert cache.get(["b"]) is None
    assert cache.get(["a"]) is not None and cache.get(["c"]) is not None
    assert cache.num_bytes == 2 * FEATURES
    cache.put("huge", mx.zeros((1024, 1024), dtype=mx.float32))  # beyond the bound: not kept
    assert cache.get(["huge"]) is None and cache.num_bytes == 2 * FEATURES
