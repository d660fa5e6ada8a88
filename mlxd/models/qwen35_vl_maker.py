"""The Qwen3.5 maker: a tiny mlx-vlm Qwen3.5 checkpoint (vision and language) with random weights.

Qwen3.5 is natively multimodal: a Qwen3-VL vision tower (learned position embeddings, 2 x 2
patch groups merged into one image token; no deepstack features, which mlx-vlm 0.7.10 refuses
for Qwen3.5) before a hybrid language model of Gated DeltaNet layers and gated attention layers
whose rotary positions are multimodal (interleaved mRoPE sections). At the tiny shape: layer 0
is a Gated DeltaNet, layer 1 attention. Its processor (mlx-vlm's ``Qwen3VLProcessor`` through
transformers' ``AutoProcessor``) resizes each image to a multiple of 32 pixels between
``MIN_PIXELS`` and ``MAX_PIXELS`` (a 224 x 224 image: 49 tokens). Qwen3.5-MoE is the same with
a sparse MLP (routed experts and a gated shared expert) in every layer. Written by
``vlm_maker.make_vlm(arch="qwen3_5_vl")`` and ``(arch="qwen3_5_moe_vl")``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlxd.models.maker import Progress
from mlxd.models.presets import TINY_SHAPE
from mlxd.models.qwen_vl_maker import (
    IMAGE_PAD_ID,
    VIDEO_PAD_ID,
    VISION_END_ID,
    VISION_START_ID,
    VOCAB_SIZE,
    _add_vision_tokens,
)
from mlxd.models.tokenizer_maker import EOS_TOKEN_ID, PAD_TOKEN_ID
from mlxd.models.vlm_maker import train_tokenizer, write_checkpoint, write_json

PATCH_SIZE = 16
MERGE_SIZE = 2
MIN_PIXELS = 64 * 64
MAX_PIXELS = 224 * 224  # at most 49 image tokens an image
# Half of each 16-wide head rotates (8 dimensions, 4 frequencies), interleaved over the time,
# height and width rows as the real checkpoints' [11, 11, 10] of 32.
PARTIAL_ROTARY = 0.5
MROPE_SECTION = [2, 1, 1]
_LINEAR = {  # Gated DeltaNet heads (the zoo's qwen3_5 text shape)
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}
_MOE = {  # four routed experts, two a token, and a shared one
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "norm_topk_prob": True,
}
_MEAN = [0.5, 0.5, 0.5]


# Public API


def qwen3_5_vl_config(moe: bool = False) -> dict[str, Any]:
    """The checkpoint's ``config.json``: the hybrid text model under ``text_config`` (one
    Gated DeltaNet layer, then one attention layer; ``moe``: sparse MLPs), the vision tower
    under ``vision_config``."""
    family = "qwen3_5_moe" if moe else "qwen3_5"
    text = {
        **TINY_SHAPE,
        **_LINEAR,
        **(_MOE if moe else {}),
        "model_type": f"{family}_text",
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "eos_token_id": EOS_TOKEN_ID,
        "rope_parameters": {
            "rope_type": "default",
            "mrope_interleaved": True,
            "mrope_section": MROPE_SECTION,
            "rope_theta": 1_000_000.0,
            "partial_rotary_factor": PARTIAL_ROTARY,
        },
    }
    vision = {
        "model_type": family,
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": TINY_SHAPE["hidden_size"],
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,  # an 8 x 8 grid, interpolated to each image's
        "in_channels": 3,
        "deepstack_visual_indexes": [],
    }
    return {
        "model_type": family,
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "vocab_size": VOCAB_SIZE,
        "image_token_id": IMAGE_PAD_ID,
        "video_token_id": VIDEO_PAD_ID,
        "vision_start_token_id": VISION_START_ID,
        "vision_end_token_id": VISION_END_ID,
        "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def build_qwen3_5_vl(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the dense checkpoint into the (staged, empty) ``out_dir``."""
    _build(out_dir, seed, report, moe=False)


def build_qwen3_5_moe_vl(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the mixture-of-experts checkpoint into the (staged, empty) ``out_dir``."""
    _build(out_dir, seed, report, moe=True)


# Internal helpers


def _build(out_dir: Path, seed: int, report: Progress, moe: bool) -> None:
    import importlib

    family = importlib.import_module(
        "mlx_vlm.models.qwen3_5_moe" if moe else "mlx_vlm.models.qwen3_5"
    )
    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_vision_tokens(out_dir)
    _name_processor(out_dir)
    files = {
        "preprocessor_config.json": _preprocessor(),
        "video_preprocessor_config.json": _preprocessor(),
        "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
    }
    write_checkpoint(out_dir, family, qwen3_5_vl_config(moe), seed, report, files)


def _name_processor(out_dir: Path) -> None:
    """The tokenizer's config names Qwen3-VL's processor (the Qwen2.5-VL maker's names its)."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["processor_class"] = "Qwen3VLProcessor"
    write_json(path, config)


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
        "image_mean": _MEAN,
        "image_std": _MEAN,
        "do_convert_rgb": True,
    }
