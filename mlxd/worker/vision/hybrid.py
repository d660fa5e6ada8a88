"""A hybrid VLM's language model (Qwen3.5): Gated DeltaNet layers beside multimodal-RoPE attention.

Qwen3.5's language model mixes recurrent layers (a fixed-size state per sequence, mlx-vlm's
``ArraysCache``) with gated attention layers whose positions are Qwen's three mRoPE rows, so it
is served by the hybrid runner (``runners.hybrid``), with ``position_ids`` as Qwen2.5-VL's
(``vision.mrope``). mlx-vlm's own decoder forward reads its batch caches' fields (``left_padding``,
``extract``, per-row offsets) to pick row-by-row paths, and cuts an array mask to the keys its
cache offsets imply, which the pool's masks (every key a row's blocks hold) do not match. So this
forward runs mlx-vlm's layers itself, as its decoder's plain path runs them: the same modules,
rotary tables and attention kernel, one mask from the pool; the recurrent layers are mlx-vlm's
own, on their own caches.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxd.worker.vision.mrope import MRopeTextModel, _offset_positions


class HybridMRopeTextModel(MRopeTextModel):
    """A Qwen3.5 language model as the runners call it: logits from tokens or embeddings,
    ``position_ids`` (3, B, L) for rows with images, else each column's cache offset."""

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        input_embeddings: mx.array | None = None,
        position_ids: mx.array | None = None,
    ) -> mx.array:
        decoder = self.language_model.model
        h = decoder.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        caches = cache if cache else [None] * len(decoder.layers)
        attention_cache = caches[decoder.fa_idx]
        if position_ids is None:
            position_ids = _offset_positions([attention_cache], *inputs.shape[:2])
        from mlx_vlm.models.base import create_attention_mask

        mask = create_attention_mask(h, attention_cache)
        rotary = self._rotary(h, position_ids)
        recurrent = caches[decoder.ssm_idx]  # its lengths: rows the hybrid runner padded after
        padding = None if recurrent is None else recurrent.make_mask(h.shape[1])
        for layer, c in zip(decoder.layers, caches, strict=True):
            x = layer.input_layernorm(h)
            if layer.is_linear:
                h = h + layer.linear_attn(x, padding, c)
            else:
                h = h + _attention(layer.self_attn, x, mask, c, position_ids, rotary)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(decoder.norm(h))

    # Internal helpers

    def _rotary(self, h: mx.array, position_ids: mx.array) -> tuple[mx.array, mx.array] | None:
        """The (cos, sin) tables every attention layer shares, as mlx-vlm's decoder computes
        them once (None where its rotary applies them fused, on Metal)."""
        for layer in self.language_model.model.layers:
            if not layer.is_linear:
                rope = layer.self_attn.rotary_emb
                return None if rope.fused_apply else rope(h, position_ids)
        return None

    def _logits(self, out: mx.array) -> mx.array:
        lm = self.language_model
        if lm.args.tie_word_embeddings:
            return lm.model.embed_tokens.as_linear(out)  # type: ignore[no-any-return]
        return lm.lm_head(out)  # type: ignore[no-any-return]


def _attention(
    attn: nn.Module,
    x: mx.array,
    mask: Any,
    cache: Any,
    position_ids: mx.array,
    rotary: tuple[mx.array, mx.array] | None,
) -> mx.array:
    """mlx-vlm's gated attention (``Qwen3_5Attention``) with ``mask`` as given: its own
    projections, norms, rotary and cache write (``_prepare_projected_qkv``, handed no mask, so
    it cuts none), then attention and the output gate as its ``__call__`` runs them."""
    from mlx_vlm.models.base import scaled_dot_product_attention

    b, n, _ = x.shape
    queries, keys, values, gate, _ = attn._prepare_projected_qkv(
        attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), cache, position_ids, rotary, None
    )
    out = scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=attn.scale, mask=mask
    )
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1) * mx.sigmoid(gate))  # type: ignore[no-any-return]
