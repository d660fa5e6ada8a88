"""Llama 4's language model on the paged runner, within one attention chunk.

Llama 4's decoder has two kinds of layers: three in four rotate their queries and keys and
attend only within ``attention_chunk_size``-token chunks (8,192 in the real checkpoints;
mlx-vlm keeps a ``ChunkedKVCache`` for them), and every fourth has no rotary positions and
scales its queries by ``log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1``. mlx-vlm
0.7.10 builds the chunks' mask from the first cache's offset and start as single numbers and
the NoPE scale from the largest row's offset: one sequence at a time, as its ``generate``
runs. The paged pool has no chunk-aligned mask, and rows of a batch sit at different positions.

Within ``min(attention_chunk_size, floor_scale) - 1`` tokens both vanish: every position lies in
the first chunk, so a chunked layer attends causally over the whole context, and every NoPE
scale is exactly 1. ``Llama4TextModel`` serves that context on the paged runner (plain caches,
one causal mask for every layer) and names the limit (``context_limit``), which the worker
caps its context at; a longer context would need chunk-aligned masks in the pool.

mlx-vlm 0.7.10's Llama 4 image processor splits an image into its tiles but leaves out the
whole image shrunk to one tile, which its prompt lays out after ``<|image|>`` (as transformers'
processor adds it): for any image of more than one tile the merge gathers features past the
tower's output, unchecked, and reads whatever memory lies there (different on every call).
``add_global_tiles`` makes the processor add it, as transformers does.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache
from mlx_vlm.models.base import create_attention_mask
from mlx_vlm.models.llama4.language import LlamaModel
from mlx_vlm.models.llama4.processing_llama4 import Llama4ImageProcessor
from PIL import Image

from mlxd.worker.vision.model import TextModel


class CausalLlama4(LlamaModel):  # type: ignore[misc]
    """mlx-vlm's Llama 4 decoder with every layer causal over the context: Llama 4's own
    within its first attention chunk (``Llama4TextModel.context_limit``)."""

    def __call__(
        self,
        input_ids: mx.array | None = None,
        input_embeds: mx.array | None = None,
        mask: mx.array | None = None,
        cache: Any = None,
    ) -> mx.array:
        h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        mask = create_attention_mask(h, cache) if mask is None else mask
        for layer, c in zip(self.layers, cache or [None] * len(self.layers), strict=True):
            h = layer(h, mask, cache=c)
        return self.norm(h)  # type: ignore[no-any-return]


class Llama4TextModel(TextModel):
    """Llama 4's language model as the runners call an mlx-lm model, within one chunk."""

    def __init__(self, language_model: Any) -> None:
        super().__init__(language_model)
        language_model.model.__class__ = CausalLlama4  # the class only: its weights stay

    @property
    def context_limit(self) -> int:
        """The longest context served: within the first chunk and below the NoPE scale's
        first step."""
        config = self.args
        return min(int(config.attention_chunk_size), int(config.floor_scale)) - 1

    def make_cache(self) -> list[Any]:
        """A plain cache per layer (not mlx-vlm's chunked ones): the paged runner."""
        return [KVCache() for _ in self.layers]


class GlobalTileImageProcessor(Llama4ImageProcessor):  # type: ignore[misc]
    """mlx-vlm's Llama 4 image processor with each tiled image's global tile after its tiles."""

    def _split_into_tiles(self, image: Any, aspect_ratio: tuple[int, int]) -> list[Any]:
        tiles: list[Any] = super()._split_into_tiles(image, aspect_ratio)
        if len(tiles) > 1:
            tiles.append(image.resize((self.size, self.size), Image.BICUBIC))
        return tiles


def add_global_tiles(processor: Any) -> None:
    """Make ``processor`` (mlx-vlm's Llama 4 one) add each tiled image's global tile."""
    if type(processor.image_processor) is Llama4ImageProcessor:
        processor.image_processor.__class__ = GlobalTileImageProcessor
