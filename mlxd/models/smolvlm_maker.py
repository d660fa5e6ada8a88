"""The SmolVLM / Idefics3 maker: a tiny mlx-vlm SmolVLM checkpoint with seeded random weights.

SmolVLM's layout at the tiny shape: a SigLIP-style tower on 32 x 32 tiles in 4-pixel patches
(8 x 8), pixel-shuffled by ``SCALE_FACTOR`` into 16 image tokens a tile, and a Llama-style
decoder. Its processor splits an image into tiles (image splitting): it scales the longest side
to ``LONGEST_EDGE`` (64), rounds both sides up to whole 32-pixel tiles, and adds the whole image
shrunk to one tile last. Each tile's tokens follow ``<fake_token_around_image>`` and its
``<row_R_col_C>`` marker; the global one's follow ``<global-img>``. So a square image is 2 x 2
tiles and the global one, 80 image tokens in five runs; a 2:1 image 1 x 2 and the global one,
48. ``idefics3`` is the same checkpoint under Idefics3's names (its processor, its model type).
Written by ``vlm_maker.make_vlm(arch="smolvlm")``.
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

TILE = 32  # the tower's side: every tile and the global image
LONGEST_EDGE = 2 * TILE  # at most 2 x 2 tiles
PATCH_SIZE = 4
SCALE_FACTOR = 2  # pixel shuffle: 2 x 2 patches into one image token
IMAGE_SEQ_LEN = (TILE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 16 image tokens a tile
MAX_TILES_SIDE = LONGEST_EDGE // TILE
IMAGE_TOKEN = "<image>"
FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TOKEN = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
ROW_COL_TOKENS = tuple(
    f"<row_{r}_col_{c}>" for r in range(1, MAX_TILES_SIDE + 1) for c in range(1, MAX_TILES_SIDE + 1)
)
# The reserved ids past the trained vocabulary that become the image tokens, in id order.
TOKENS = (IMAGE_TOKEN, FAKE_TOKEN, GLOBAL_TOKEN, END_OF_UTTERANCE, *ROW_COL_TOKENS)
TOKEN_IDS = {t: TRAINED_VOCAB_SIZE + n for n, t in enumerate(TOKENS)}
VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}{%- endif -%}"
)
# The family's names: model type, vision model type, processor, image processor.
_NAMES = {
    "smolvlm": ("smolvlm", "smolvlm_vision", "SmolVLMProcessor", "SmolVLMImageProcessor"),
    "idefics3": ("idefics3", "idefics3_vision", "Idefics3Processor", "Idefics3ImageProcessor"),
}


# Public API


def smolvlm_config(arch: str = "smolvlm") -> dict[str, Any]:
    """The checkpoint's ``config.json`` (``arch``: ``smolvlm`` or ``idefics3``)."""
    model_type, vision_type, _, _ = _NAMES[arch]
    text = {
        **{k: v for k, v in TINY_SHAPE.items() if k != "head_dim"},  # hidden // heads
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100_000.0,
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": vision_type,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": TILE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
    }
    return {
        "model_type": model_type,
        "architectures": [
            f"{'SmolVLM' if arch == 'smolvlm' else 'Idefics3'}ForConditionalGeneration"
        ],
        "image_token_id": TOKEN_IDS[IMAGE_TOKEN],
        "scale_factor": SCALE_FACTOR,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def build_smolvlm(out_dir: Path, seed: int, report: Progress) -> None:
    """Write SmolVLM's checkpoint into the (staged, empty) ``out_dir``."""
    _build(out_dir, seed, report, "smolvlm")


def build_idefics3(out_dir: Path, seed: int, report: Progress) -> None:
    """Write Idefics3's checkpoint (SmolVLM's under Idefics3's names) into ``out_dir``."""
    _build(out_dir, seed, report, "idefics3")


# Internal helpers


def _build(out_dir: Path, seed: int, report: Progress, arch: str) -> None:
    import importlib

    family = importlib.import_module(f"mlx_vlm.models.{arch}")
    _, _, processor_class, image_processor = _NAMES[arch]
    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_image_tokens(out_dir, processor_class)
    files = {
        "preprocessor_config.json": _preprocessor(image_processor, processor_class),
        "processor_config.json": {
            "processor_class": processor_class,
            "image_seq_len": IMAGE_SEQ_LEN,
        },
    }
    write_checkpoint(out_dir, family, smolvlm_config(arch), seed, report, files)


def _add_image_tokens(out_dir: Path, processor_class: str) -> None:
    """The first reserved tokens become the image tokens (special, never split); the chat
    template renders an image part as ``<image>``, which the processor expands into tiles."""
    add_image_tokens(out_dir, TOKEN_IDS, _IMAGE_PART, processor_class)


def _preprocessor(image_processor: str, processor_class: str) -> dict[str, Any]:
    """Image splitting into ``TILE``-pixel tiles of an image scaled to ``LONGEST_EDGE``."""
    return {
        "image_processor_type": image_processor,
        "processor_class": processor_class,
        "do_resize": True,
        "size": {"longest_edge": LONGEST_EDGE},
        "max_image_size": {"longest_edge": TILE},
        "do_image_splitting": True,
        "resample": 1,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
        "do_pad": True,
    }
