"""The Mistral 3 maker: a tiny mlx-vlm Mistral 3 (Pixtral tower) checkpoint with random weights.

Mistral 3's layout at the tiny shape: Pixtral's vision tower (2D rotary positions over each
image's own patch grid, images of any size side by side, each attending within itself) on
4-pixel patches, a patch merger folding 2 x 2 patches into one image token, and a Ministral 3
decoder whose first layer attends within a 16-token window (a rotating cache: the window
runner) beside a full one. The processor keeps each image's aspect ratio (its longest side
scaled to at most 64 pixels, both rounded up to whole 8-pixel tokens) and lays it out row by
row: a row's ``[IMG]`` tokens, ``[IMG_BREAK]`` between rows, ``[IMG_END]`` after the last; a
64 x 64 image is 64 image tokens, a 64 x 32 one 32. Written by
``vlm_maker.make_vlm(arch="mistral3")``.
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

PATCH_SIZE = 4
MERGE_SIZE = 2  # 2 x 2 patches: one image token of 8 x 8 pixels
LONGEST_EDGE = 64  # at most 8 x 8 image tokens an image
WINDOW = 16  # the window layer's keys: shorter than a prompt, so slabs go back
IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
TOKEN_IDS = {t: TRAINED_VOCAB_SIZE + n for n, t in enumerate((IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN))}
VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
# Ministral 3's rope: its queries are scaled up every ``original_max_position_embeddings``
# positions (16,384 in the real ones; 32 here, so every prompt crosses several steps and rows of
# a batch at different positions take different scales).
ROPE = {
    "rope_type": "default",
    "rope_theta": 1_000_000.0,
    "llama_4_scaling_beta": 0.1,
    "original_max_position_embeddings": 32,
}
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}{%- endif -%}"
)


# Public API


def mistral3_config() -> dict[str, Any]:
    """The checkpoint's ``config.json``."""
    text = {
        **TINY_SHAPE,
        "model_type": "ministral3",
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": WINDOW,
        "rope_parameters": ROPE,
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "pixtral",
        "hidden_size": 32,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": LONGEST_EDGE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "rope_theta": 10_000.0,
    }
    return {
        "model_type": "mistral3",
        "architectures": ["Mistral3ForConditionalGeneration"],
        "image_token_index": TOKEN_IDS[IMAGE_TOKEN],
        "spatial_merge_size": MERGE_SIZE,
        "vision_feature_layer": -1,
        "multimodal_projector_bias": False,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def build_mistral3(out_dir: Path, seed: int, report: Progress) -> None:
    """Write the checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import mistral3

    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_image_tokens(out_dir)
    processor = {
        "processor_class": "Mistral3Processor",
        "image_token": IMAGE_TOKEN,
        "image_break_token": BREAK_TOKEN,
        "image_end_token": END_TOKEN,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
    }
    files = {"preprocessor_config.json": _preprocessor(), "processor_config.json": processor}
    write_checkpoint(out_dir, mistral3, mistral3_config(), seed, report, files)


# Internal helpers


def _add_image_tokens(out_dir: Path) -> None:
    """The first reserved tokens become Pixtral's image tokens (special, never split); the
    chat template renders an image part as ``[IMG]``, which the processor expands row by row."""
    add_image_tokens(out_dir, TOKEN_IDS, _IMAGE_PART, "Mistral3Processor")


def _preprocessor() -> dict[str, Any]:
    """Pixtral's: the longest side scaled to at most ``LONGEST_EDGE``, aspect kept."""
    return {
        "image_processor_type": "PixtralImageProcessor",
        "processor_class": "Mistral3Processor",
        "size": {"longest_edge": LONGEST_EDGE},
        "patch_size": {"height": PATCH_SIZE, "width": PATCH_SIZE},
        "do_resize": True,
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
        "do_convert_rgb": True,
    }
