"""The Llama 4 maker: a tiny mlx-vlm Llama 4 checkpoint with seeded random weights.

Llama 4's layout at the tiny shape: a ViT on 112 x 112 tiles in 14-pixel patches (8 x 8, a
class token, 2D rotary positions), pixel-shuffled by half a side into 16 image tokens a tile,
and a four-layer Llama 4 decoder: three layers with rotary positions that attend within
``attention_chunk_size``-token chunks and one without (NoPE, its queries scaled by position
past ``floor_scale``), every other layer a mixture of experts beside a shared expert. Its
processor picks the tiling that fits the image best (up to ``MAX_PATCHES`` tiles) and lays the
image out as ``<|image_start|>``, the tiles' ``<|patch|>`` runs between ``<|tile_x_separator|>``
and ``<|tile_y_separator|>``, ``<|image|>``, the whole image shrunk to one tile, and
``<|image_end|>``: a square image is one tile (16 image tokens), a 2:1 one two tiles and the
global one (48). Written by ``vlm_maker.make_vlm(arch="llama4")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxd.models.maker import Progress
from mlxd.models.presets import TINY_SHAPE
from mlxd.models.tokenizer_maker import (
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    TRAINED_VOCAB_SIZE,
)
from mlxd.models.vlm_maker import (
    add_image_tokens,
    train_tokenizer,
    write_checkpoint,
)

TILE = 112
PATCH_SIZE = 14  # the processor's own (it reads no patch size from the checkpoint)
MAX_PATCHES = 4  # tiles an image at most (1 x 1 ... 2 x 2, 1 x 4, 4 x 1)
# The chunked layers' chunk, and the position past which the NoPE layer scales its queries:
# mlxd serves a context within both (``worker/vision/llama4.py``), 255 tokens here.
CHUNK = 256
IMAGE_TOKEN = "<|image|>"
PATCH_TOKEN = "<|patch|>"
TOKENS = (
    "<|image_start|>",
    "<|image_end|>",
    IMAGE_TOKEN,
    PATCH_TOKEN,
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
)
TOKEN_IDS = {t: TRAINED_VOCAB_SIZE + n for n, t in enumerate(TOKENS)}
VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}{%- endif -%}"
)


# Public API


def llama4_config() -> dict[str, Any]:
    """The checkpoint's ``config.json``."""
    text = {
        **TINY_SHAPE,
        "model_type": "llama4_text",
        "num_hidden_layers": 4,  # the fourth is the NoPE, full-attention one
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        "intermediate_size_mlp": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,  # layers 1 and 3 are experts, 0 and 2 dense
        "use_qk_norm": True,
        "attention_chunk_size": CHUNK,
        "floor_scale": CHUNK,
        "attn_temperature_tuning": True,
        "attn_scale": 0.1,
        "max_position_embeddings": 4096,
        "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "llama4_vision_model",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,  # four patches' hidden: the pixel shuffle's input
        "image_size": TILE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "norm_eps": 1e-5,
        "initializer_range": 0.02,
        "pixel_shuffle_ratio": 0.5,
        "projector_dropout": 0.0,
        "projector_input_dim": 64,
        "projector_output_dim": 64,
        "vision_output_dim": 64,
        "rope_theta": 10_000.0,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
    }
    return {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "image_token_index": TOKEN_IDS[PATCH_TOKEN],
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def build_llama4(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import llama4

    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_image_tokens(out_dir)
    files = {
        "preprocessor_config.json": _preprocessor(),
        "processor_config.json": {"processor_class": "Llama4Processor"},
    }
    write_checkpoint(out_dir, llama4, llama4_config(), seed, report, files)


# Internal helpers


def _add_image_tokens(out_dir: Path) -> None:
    """The first reserved tokens become Llama 4's image tokens (special, never split); the
    chat template renders an image part as ``<|image|>``, which the processor expands."""
    add_image_tokens(out_dir, TOKEN_IDS, _IMAGE_PART, "Llama4Processor")


def _preprocessor() -> dict[str, Any]:
    """mlx-vlm's Llama 4 image processor reads the tile's side, the most tiles, the norm."""
    return {
        "image_processor_type": "Llama4ImageProcessor",
        "processor_class": "Llama4Processor",
        "size": {"height": TILE, "width": TILE},
        "max_patches": MAX_PATCHES,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
