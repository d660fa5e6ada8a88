"""The memory a vision-language model needs beyond its weights and KV: one rule, read by the
daemon's footprint and the worker's feature cache (no mlx here, as in ``kv_layout``)."""

from __future__ import annotations

from typing import Any

# The vision tower's features kept by image digest (worker/vision/encoder.py), at most this many
# bytes: a follow-up turn about one image never runs the tower again.
FEATURE_CACHE_BYTES = 64 * 2**20


def vision_headroom(model_config: dict[str, Any]) -> int:
    """The bytes a model's vision side holds at most: its feature cache; 0 for a text model."""
    return FEATURE_CACHE_BYTES if isinstance(model_config.get("vision_config"), dict) else 0
