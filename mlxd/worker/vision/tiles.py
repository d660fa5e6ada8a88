"""Tiled images: where each image's placeholders end when an image is split into several runs.

SmolVLM and Idefics3 split an image into tiles (image splitting): each tile's placeholders
follow a ``<row_R_col_C>`` marker, and the whole image shrunk to one tile comes last, after
``<global-img>``. An image's placeholder count follows its aspect ratio (2 x 2 tiles and the
global one, 1 x 2 and the global one, ...), so a prompt's placeholders cannot be split evenly
among its images: the prefix-cache keys and the feature cache need each image's own count,
read here from the prompt (every image ends with the run after its global marker).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Families whose processors split images into tiles, and the token before each image's last run.
GLOBAL_MARKERS = {"smolvlm": "<global-img>", "idefics3": "<global-img>"}


def global_marker(config: Any, tokenizer: Any) -> int | None:
    """The id of the token before each image's last run (None: the family does not tile)."""
    token = GLOBAL_MARKERS.get(getattr(config, "model_type", ""))
    return None if token is None else int(tokenizer.convert_tokens_to_ids(token))


def image_counts(ids: list[int], positions: np.ndarray, marker: int) -> list[int]:
    """Each image's placeholder count, in prompt order: an image's runs end with the one
    right after ``marker``."""
    if len(positions) == 0:
        return []
    runs = np.split(positions, np.nonzero(np.diff(positions) != 1)[0] + 1)
    counts = [0]
    for run in runs:
        counts[-1] += len(run)
        if ids[int(run[0]) - 1] == marker:
            counts.append(0)
    return counts[:-1] if counts[-1] == 0 else counts
