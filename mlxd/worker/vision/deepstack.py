"""Deepstack features (Qwen3-VL): the vision tower's intermediate features, added into the first
decoder layers' hidden states at the image tokens.

Qwen3-VL's tower hands out, beside the features spliced into the embeddings, one more set per
``deepstack_visual_indexes`` block (merged like the last); decoder layer ``i`` adds set ``i``
at the image positions of its output. mlx-vlm passes the whole prompt's, one sequence at a
time: ``visual_pos_masks`` (B, L) marks the image columns and ``deepstack_visual_embeds`` holds,
per layer, their features in row-major order. A batched prefill forward passes its own: each
row's columns that hold the placeholders of its chunk, and those placeholders' features, so a
prompt split over chunks, resumed after a prefix hit or beside text rows adds each feature once,
at its token. The encoder keeps an image's deepstack features beside its spliced ones (one
array, side by side along the hidden axis), so the feature cache keeps them per image too.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import numpy as np

from mlxd.worker.vision.mrope import MRopeTextModel


def takes_deepstack(language_model: Any) -> bool:
    """Whether ``language_model`` adds deepstack features (Qwen3-VL, dense and MoE)."""
    return "deepstack_visual_embeds" in inspect.signature(language_model.__call__).parameters


def forward_inputs(
    mask: np.ndarray, features: list[mx.array], hidden: int, layers: int
) -> dict[str, Any]:
    """The language model's deepstack arguments for a forward whose image columns are ``mask``
    (B, W) and whose rows' picked features are ``features`` (in row order, each (n, hidden x
    (1 + layers)): the spliced ones first, then each layer's)."""
    picked = mx.concatenate(features)[:, hidden:]
    per_layer = picked.reshape(picked.shape[0], layers, hidden).transpose(1, 0, 2)
    return {
        "visual_pos_masks": mx.array(mask),
        "deepstack_visual_embeds": [per_layer[i] for i in range(layers)],
    }


class DeepstackTextModel(MRopeTextModel):
    """A Qwen3-VL language model as the runners call it: multimodal positions, and a prefill
    chunk's deepstack features at its image columns (none for text and decode forwards)."""

    def __init__(self, language_model: Any) -> None:
        super().__init__(language_model)
        _masks_to_keys(language_model)

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        input_embeddings: mx.array | None = None,
        position_ids: mx.array | None = None,
        visual_pos_masks: mx.array | None = None,
        deepstack_visual_embeds: list[mx.array] | None = None,
    ) -> mx.array:
        if deepstack_visual_embeds is None:
            return super().__call__(inputs, cache, input_embeddings, position_ids)
        assert position_ids is not None, "an image chunk has its multimodal positions"
        out = self.language_model(
            inputs,
            cache=cache,
            inputs_embeds=input_embeddings,
            position_ids=position_ids,
            visual_pos_masks=visual_pos_masks,
            deepstack_visual_embeds=deepstack_visual_embeds,
        )
        return out.logits  # type: ignore[no-any-return]


def _masks_to_keys(language_model: Any) -> None:
    """Qwen3-VL MoE's layers attend as the dense model's do. mlx-vlm 0.7.10's MoE attention
    cuts its mask to ``offset + length + 1`` columns (the longest row's), as a contiguous cache
    one sequence long has keys; the pool's keys are as wide as the step's block tables or
    decode's view, so the mask would not broadcast. The dense attention cuts it to the keys'
    width; the two are alike in weights and arithmetic otherwise."""
    from mlx_vlm.models.qwen3_vl import language as dense

    for layer in language_model.layers:
        if type(layer.self_attn).__module__.endswith("qwen3_vl_moe.language"):
            layer.self_attn.__class__ = dense.Attention
