"""Multimodal rotary positions (Qwen2.5-VL's mRoPE): each token's (time, height, width) position.

A Qwen-VL decoder rotates queries and keys by three position rows, not by the cache offset.
Text tokens have one position in all three; an image's tokens take their place in the image's
grid of merged patches (time, row, column), offset past the text before it; text after an image
resumes at the largest position so far + 1. So a prompt with images ends at a position smaller
than its length: every later token (the rest of the prompt beyond it, the answer) is at its
index + ``delta`` (< 0). mlx-vlm keeps these on the model, one sequence at a time; a batch
keeps them per sequence: ``prompt_positions`` computes the prompt's rows when its images are
prepared (numpy, on the encoder's threads), ``PromptImages`` keeps them with ``delta``, and
``MRope.position_ids`` gives any forward's rows (a prefill chunk, a decode step, a
verification) for the sequence positions of its columns. K/V are stored rotated, so the prefix
cache is unaffected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from mlxd.worker.vision.model import TextModel

if TYPE_CHECKING:
    from mlxd.worker.sched.sequence import Sequence

PAD = -1  # a column that holds no token of its row (left padding)


def prompt_positions(
    ids: list[int], grids: np.ndarray, image_token_id: int, merge: int
) -> tuple[np.ndarray, int]:
    """(the (3, len(ids)) positions of a prompt, its ``delta``): images in the order of their
    placeholder runs, ``grids[k]`` the k-th's (time, height, width) in patches, ``merge`` x
    ``merge`` patches to a token (as mlx-vlm's ``get_rope_index`` for images)."""
    tokens = np.asarray(ids)
    out = np.empty((3, len(ids)), dtype=np.int64)
    start, next_pos = 0, 0
    for t, h, w in _grids(grids, merge):
        first = start + int(np.argmax(tokens[start:] == image_token_id))
        out[:, start:first] = next_pos + np.arange(first - start)
        base = next_pos + first - start
        grid = np.indices((t, h, w)).reshape(3, -1)  # time, row, column of each token
        out[:, first : first + grid.shape[1]] = base + grid
        next_pos = base + max(t, h, w)
        start = first + grid.shape[1]
    out[:, start:] = next_pos + np.arange(len(ids) - start)
    return out, next_pos - start


class MRope:
    """The position ids a Qwen-VL decoder takes, for the rows of a batched forward."""

    def position_ids(self, rows: list[tuple[Sequence, list[int]]]) -> mx.array | None:
        """(3, B, L) positions of a forward whose row ``b`` holds ``rows[b]``'s sequence at
        the given sequence positions (``PAD`` for padding); None when no row has images (text
        positions are the cache's offsets, which the model falls back to)."""
        if not any(s.images is not None and s.images.mrope is not None for s, _ in rows):
            return None
        return mx.array(np.stack([_row(s, cols) for s, cols in rows], axis=1).astype(np.int32))

    def decode(self, rows: list[Sequence]) -> mx.array | None:
        """A decode step's positions: each row's next token is at ``num_computed``."""
        return self.position_ids([(s, [s.num_computed]) for s in rows])


class MRopeTextModel(TextModel):
    """A Qwen-VL language model as the runners call it, taking ``position_ids`` (3, B, L);
    without them, each column's position is its cache offset (text rows)."""

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        input_embeddings: mx.array | None = None,
        position_ids: mx.array | None = None,
    ) -> mx.array:
        if position_ids is None:
            position_ids = _offset_positions(cache, *inputs.shape[:2])
        out = self.language_model(
            inputs, cache=cache, inputs_embeds=input_embeddings, position_ids=position_ids
        )
        return out.logits  # type: ignore[no-any-return]

    @property
    def args(self) -> Any:
        """The text config (Qwen-VL's ``config`` is the whole model's)."""
        return self.language_model.args


def _grids(grids: np.ndarray, merge: int) -> list[tuple[int, int, int]]:
    return [(int(t), int(h) // merge, int(w) // merge) for t, h, w in np.asarray(grids)]


def _row(seq: Sequence, columns: list[int]) -> np.ndarray:
    """(3, len(columns)) positions of ``seq`` at sequence positions ``columns``: its prompt's
    own rows, ``index + delta`` past them, 0 for padding."""
    cols = np.asarray(columns, dtype=np.int64)
    img = seq.images
    if img is None or img.mrope is None:
        return np.broadcast_to(np.maximum(cols, 0), (3, len(cols)))
    table: np.ndarray = img.mrope
    inside = (cols >= 0) & (cols < table.shape[1])
    out = np.broadcast_to(np.maximum(cols, 0) + img.delta, (3, len(cols))).copy()
    out[:, inside] = table[:, cols[inside]]
    out[:, cols < 0] = 0
    return out


def _offset_positions(cache: Any, batch: int, length: int) -> mx.array:
    """Text positions from the first layer cache's offset (an int, or one per row)."""
    offset = 0 if not cache else cache[0].offset
    if isinstance(offset, mx.array) and offset.ndim:
        pos = offset.reshape(-1, 1) + mx.arange(length)[None]
    else:
        pos = mx.broadcast_to(int(offset) + mx.arange(length)[None], (batch, length))
    return mx.broadcast_to(pos[None], (3, batch, length))
