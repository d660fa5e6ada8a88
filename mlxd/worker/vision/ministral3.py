"""Ministral 3's attention scale per row: Mistral 3's language model in a batch of sequences.

Ministral 3 scales its queries by ``1 + beta * log(1 + floor(position / original_max))``
(Llama 4's scaling: 1 below 16,384 tokens in the real checkpoints, larger past it). mlx-vlm
0.7.10's decoder takes the positions from the first cache's offset as one number (its
``offset[0]``): one sequence at a time, as its ``generate`` runs. mlxd's paged caches hold one
offset per row, and rows of a batch sit at different positions, so every row would take the
first row's scale. ``RowScaledMinistral3`` computes it per row as mlx-lm's Ministral 3 does
(``(B, 1, L, 1)`` from the offsets), and is otherwise mlx-vlm's decoder.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.ministral3 import _get_llama_4_attn_scale
from mlx_vlm.models.base import create_attention_mask
from mlx_vlm.models.mistral3.language import Ministral3


class RowScaledMinistral3(Ministral3):  # type: ignore[misc]
    """mlx-vlm's Ministral 3 decoder with each row's attention scale from its own offset."""

    def __call__(
        self, inputs: mx.array, cache: Any = None, inputs_embeds: mx.array | None = None
    ) -> mx.array:
        h = self.embed_tokens(inputs) if inputs_embeds is None else inputs_embeds
        cache = [None] * len(self.layers) if cache is None else cache
        full_mask = create_attention_mask(h, cache[self.fa_idx])
        window_mask = None
        if self.swa_idx is not None:
            window = self.sliding_window
            window_mask = create_attention_mask(h, cache[self.swa_idx], window_size=window)
        scale = self._attn_scale(h, 0 if cache[0] is None else cache[0].offset)
        for layer, c in zip(self.layers, cache, strict=True):
            h = layer(h, scale, window_mask if layer.use_sliding else full_mask, cache=c)
        return self.norm(h)  # type: ignore[no-any-return]

    def _attn_scale(self, h: mx.array, offset: int | mx.array) -> mx.array:
        """(B, 1, L, 1) for per-row offsets (B,), (L, 1) for one offset."""
        rope = self.config.rope_parameters
        beta, original = rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"]
        return _get_llama_4_attn_scale(h.shape[1], offset, beta, original).astype(h.dtype)


def scale_rows(language_model: Any) -> None:
    """Make ``language_model``'s decoder scale per row when it is mlx-vlm's Ministral 3 (in
    place: the class only, its weights stay)."""
    if type(language_model.model) is Ministral3:
        language_model.model.__class__ = RowScaledMinistral3
