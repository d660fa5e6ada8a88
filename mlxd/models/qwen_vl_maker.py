"""The Qwen2.5-VL maker: a tiny mlx-vlm Qwen2.5-VL checkpoint with seeded random weights.

Qwen2.5-VL's layout at the tiny shape: a windowed ViT whose 2 x 2 patch groups merge into one
image token each, and a Qwen2 decoder whose rotary positions are multimodal (mRoPE: time,
height and width sections). Its processor resizes each image to a multiple of 28 pixels
between ``MIN_PIXELS`` and ``MAX_PIXELS``, so the image tokens follow the image's size (a
224 x 224 image: 64). Written by ``vlm_maker.make_vlm(arch="qwen2_5_vl")``.
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

# The reserved ids past the trained vocabulary that become Qwen's vision tokens, in id order.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = (
    TRAINED_VOCAB_SIZE + n for n in range(len(VISION_TOKENS))
)
VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
PATCH_SIZE = 14
MERGE_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224  # at most 64 image tokens an image
# Head dimension 16: 8 rotary frequencies, split into time, height and width sections.
MROPE_SECTION = [2, 3, 3]
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}{%- endif -%}"
)


# Public API


def qwen2_5_vl_config() -> dict[str, Any]:
    """The checkpoint's ``config.json``: the text model's fields at the top level (as
    Qwen2.5-VL's own configs have them), the vision tower's under ``vision_config``."""
    vision = {
        "model_type": "qwen2_5_vl",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": TINY_SHAPE["hidden_size"],
        "patch_size": PATCH_SIZE,
        "spatial_patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "in_channels": 3,
        "tokens_per_second": 2,
    }
    return {
        **{k: v for k, v in TINY_SHAPE.items() if k != "head_dim"},  # hidden // heads
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION},
        "tie_word_embeddings": False,
        "image_token_id": IMAGE_PAD_ID,
        "video_token_id": VIDEO_PAD_ID,
        "vision_start_token_id": VISION_START_ID,
        "vision_end_token_id": VISION_END_ID,
        "bos_token_id": None,  # else transformers' Qwen default, past this vocabulary
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "vision_config": vision,
    }


def build_qwen2_5_vl(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import qwen2_5_vl

    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_vision_tokens(out_dir)
    files = {
        "preprocessor_config.json": _preprocessor(),
        # Read too (else fetched from the Hub by name): the video processor's settings.
        "video_preprocessor_config.json": _preprocessor(),
        "processor_config.json": {"processor_class": "Qwen2_5_VLProcessor"},
    }
    write_checkpoint(out_dir, qwen2_5_vl, qwen2_5_vl_config(), seed, report, files)


# Internal helpers


def _add_vision_tokens(out_dir: Path) -> None:
    """The first reserved tokens become Qwen's vision tokens (special, never split); the chat
    template renders an image part as ``<|vision_start|><|image_pad|><|vision_end|>``."""
    ids = {token: TRAINED_VOCAB_SIZE + n for n, token in enumerate(VISION_TOKENS)}
    add_image_tokens(out_dir, ids, _IMAGE_PART, "Qwen2_5_VLProcessor")


def _preprocessor() -> dict[str, Any]:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": 2,
        "merge_size": MERGE_SIZE,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
        "do_convert_rgb": True,
    }
