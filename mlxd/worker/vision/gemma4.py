"""Gemma 4's language model for the runners: scaled embeddings and per-layer token inputs.

mlx-vlm 0.7.10's Gemma 4 merge (``get_input_embeddings``) scales the token embeddings by
sqrt(hidden) before it scatters the image features in (they are not scaled), and hands the
decoder per-layer inputs looked up from the prompt's ids with every image (and audio, video)
placeholder read as token 0. Its decoder, given embeddings, does not scale them, and looks its
per-layer inputs up from the ids it is given. So ``Gemma4TextModel.embed`` scales, and its
forward passes the ids with the placeholders zeroed: a chunk with image tokens reaches the
layers exactly as mlx-vlm's own prefill does, and a text chunk (ids alone, scaled by the
decoder) as before.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxd.worker.vision.model import TextModel

_PLACEHOLDERS = ("image_token_id", "audio_token_id", "video_token_id")


class Gemma4TextModel(TextModel):
    """mlx-vlm's Gemma 4 language model as the runners call an mlx-lm model."""

    def __init__(self, language_model: nn.Module, config: Any) -> None:
        super().__init__(language_model)
        ids = [getattr(config, name, None) for name in _PLACEHOLDERS]
        self._placeholders = mx.array([int(i) for i in ids if i is not None])

    def __call__(
        self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None
    ) -> mx.array:
        if input_embeddings is not None:  # the merge's per-layer inputs: placeholders as 0
            hit = (inputs[..., None] == self._placeholders).any(axis=-1)
            inputs = mx.where(hit, mx.zeros_like(inputs), inputs)
        return super().__call__(inputs, cache, input_embeddings)

    def embed(self, tokens: mx.array) -> mx.array:
        """The token embeddings scaled by sqrt(hidden), as the merge scales them."""
        return super().embed(tokens) * self.model.embed_scale


def bidirectional_images(config: Any) -> bool:
    """Whether the checkpoint's image tokens attend each other both ways (the larger Gemma 4s'
    ``use_bidirectional_attention: vision``): each image is then prefilled in one forward,
    its masks opened within it (``sched.image_spans``)."""
    text = getattr(config, "text_config", None)
    return getattr(text, "use_bidirectional_attention", None) == "vision"
