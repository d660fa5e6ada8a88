"""The Qwen3-VL maker: a tiny mlx-vlm Qwen3-VL checkpoint with seeded random weights.

Qwen3-VL's layout at the tiny shape: a ViT in 16-pixel patches with learned position embeddings
(interpolated to each image's grid), whose 2 x 2 patch groups merge into one image token each;
the outputs of its first blocks (``deepstack_visual_indexes``) merge too and are added into the
first decoder layers' hidden states at the image tokens (deepstack); a Qwen3 decoder (q/k
norms) whose rotary positions are multimodal, interleaved (time, height, width by frequency).
Its processor (mlx-vlm's ``Qwen3VLProcessor``) resizes each image to a multiple of 32 pixels
between ``MIN_PIXELS`` and ``MAX_PIXELS``: a 256 x 256 image is 64 image tokens. Its vision
tokens and chat template are Qwen2.5-VL's (``qwen_vl_maker``). The MoE variant
(``qwen3_vl_moe``) is the same with a mixture-of-experts MLP in every decoder layer. Written by
``vlm_maker.make_vlm(arch="qwen3_vl")`` (or ``"qwen3_vl_moe"``).
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
MAX_PIXELS = 256 * 256  # at most 64 image tokens an image
# Three vision blocks; the first two also feed the decoder's two layers (deepstack).
VISION_DEPTH = 3
DEEPSTACK_INDEXES = [0, 1]
# An 8 x 8 grid of learned position embeddings, interpolated to each image's patches.
POSITION_EMBEDDINGS = 64
# Head dimension 16: 8 rotary frequencies, interleaved time, height, width (as 24:20:20 is).
MROPE_SECTION = [2, 3, 3]
PROCESSOR = "Qwen3VLProcessor"
# The MoE variant's decoder: four experts of half the dense MLP's width, two a token.
MOE_TEXT = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": TINY_SHAPE["intermediate_size"] // 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
}
_MEAN_STD = [0.5, 0.5, 0.5]


# Public API


def qwen3_vl_config() -> dict[str, Any]:
    """The checkpoint's ``config.json`` as Qwen3-VL's own: the decoder's fields under
    ``text_config``, the vision tower's under ``vision_config``."""
    text = {
        **TINY_SHAPE,
        "model_type": "qwen3_vl_text",
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "rope_theta": 5_000_000.0,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": MROPE_SECTION,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
    }
    vision = {
        "model_type": "qwen3_vl",
        "depth": VISION_DEPTH,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": TINY_SHAPE["hidden_size"],
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "num_position_embeddings": POSITION_EMBEDDINGS,
        "deepstack_visual_indexes": DEEPSTACK_INDEXES,
        "in_channels": 3,
    }
    return {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": IMAGE_PAD_ID,
        "video_token_id": VIDEO_PAD_ID,
        "vision_start_token_id": VISION_START_ID,
        "vision_end_token_id": VISION_END_ID,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": False,
        "bos_token_id": None,  # else transformers' Qwen default, past this vocabulary
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "max_position_embeddings": TINY_SHAPE["max_position_embeddings"],
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def qwen3_vl_moe_config() -> dict[str, Any]:
    """The MoE variant's ``config.json``: the dense one's, with experts in the decoder."""
    config = qwen3_vl_config()
    config["model_type"] = config["vision_config"]["model_type"] = "qwen3_vl_moe"
    config["architectures"] = ["Qwen3VLMoeForConditionalGeneration"]
    config["text_config"] = {
        **config["text_config"],
        **MOE_TEXT,
        "model_type": "qwen3_vl_moe_text",
    }
    return config


def build_qwen3_vl(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the dense checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import qwen3_vl

    _build(out_dir, seed, report, qwen3_vl, qwen3_vl_config())


def build_qwen3_vl_moe(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the MoE checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import qwen3_vl_moe

    _build(out_dir, seed, report, qwen3_vl_moe, qwen3_vl_moe_config())


# Internal helpers


def _build(out_dir: Path, seed: int, report: Progress, family: Any, config: dict[str, Any]) -> None:
    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_vision_tokens(out_dir)
    _name_processor(out_dir / "tokenizer_config.json")
    files = {  # all three read by the processor (a missing one is fetched from the Hub by name)
        "preprocessor_config.json": _preprocessor("Qwen2VLImageProcessor"),
        "video_preprocessor_config.json": _preprocessor(None),
        "processor_config.json": {"processor_class": PROCESSOR},
    }
    write_checkpoint(out_dir, family, config, seed, report, files)


def _name_processor(path: Path) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    config["processor_class"] = PROCESSOR
    write_json(path, config)


def _preprocessor(image_processor_type: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": 2,
        "merge_size": MERGE_SIZE,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _MEAN_STD,
        "image_std": _MEAN_STD,
        "do_convert_rgb": True,
    }
    if image_processor_type is not None:
        out["image_processor_type"] = image_processor_type
    return out
