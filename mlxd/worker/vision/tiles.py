"""Images in several placeholder runs: where each image's placeholders end in a prompt.

SmolVLM and Idefics3 split an image into tiles (image splitting): each tile's placeholders
follow a ``<row_R_col_C>`` marker, and the whole image shrunk to one tile comes last, after
``<global-img>``. Llama 4 tiles too: the tiles' runs between separators, then ``<|image|>``,
the global one's run and ``<|image_end|>``. Pixtral (Mistral 3) lays an image out row by row:
each row's placeholders, ``[IMG_BREAK]`` between rows, ``[IMG_END]`` after the last. Either way
an image is several runs and its placeholder count follows its size or aspect ratio, so a
prompt's placeholders cannot be split evenly among its images: the prefix-cache keys and the
feature cache need each image's own count, read here from the prompt by the token that marks
each image's last run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class LastRunMarker:
    """The token that marks an image's last run: right ``before`` it, or right after it."""

    token_id: int
    before: bool

    def closes(self, ids: list[int], run: np.ndarray) -> bool:
        """Whether ``run`` (ascending prompt positions) is its image's last."""
        at = int(run[0]) - 1 if self.before else int(run[-1]) + 1
        return 0 <= at < len(ids) and ids[at] == self.token_id


# Families whose images come in several runs: (the marker's token, whether it precedes the run).
MARKERS = {
    "smolvlm": ("<global-img>", True),
    "idefics3": ("<global-img>", True),
    "mistral3": ("[IMG_END]", False),
    "llama4": ("<|image_end|>", False),
}
# Families whose images are one run each but of different counts (Gemma 4 keeps each image's
# aspect ratio): the config's attribute naming the token right after each image.
END_TOKEN_IDS = {"gemma4": "eoi_token_id"}


def last_run_marker(config: Any, tokenizer: Any) -> LastRunMarker | None:
    """The family's marker of each image's last run (None: one run an image)."""
    model_type = getattr(config, "model_type", "")
    if model_type in END_TOKEN_IDS:
        return LastRunMarker(int(getattr(config, END_TOKEN_IDS[model_type])), before=False)
    known = MARKERS.get(model_type)
    if known is None:
        return None
    token, before = known
    return LastRunMarker(int(tokenizer.convert_tokens_to_ids(token)), before)


def image_counts(ids: list[int], positions: np.ndarray, marker: LastRunMarker) -> list[int]:
    """Each image's placeholder count, in prompt order: an image's runs end with the one the
    marker marks."""
    if len(positions) == 0:
        return []
    runs = np.split(positions, np.nonzero(np.diff(positions) != 1)[0] + 1)
    counts = [0]
    for run in runs:
        counts[-1] += len(run)
        if marker.closes(ids, run):
            counts.append(0)
    return counts[:-1] if counts[-1] == 0 else counts
