"""The Gemma 4 maker: a tiny mlx-vlm Gemma 4 checkpoint (images, no audio) with random weights.

Gemma 4's layout at the tiny shape: its vision tower (2D rotary positions over each image's own
patch grid, images of any aspect ratio) on 4-pixel patches, average-pooled 2 x 2 into image
tokens and projected into the language model; a two-layer language model (one 16-token
sliding-window layer, a rotating cache: the window runner; one full layer with its own wider
heads and proportional rope), per-layer token inputs (the E2B / E4B models' second embedding
table, which image tokens do not index) and soft-capped logits tied to the embeddings. The
processor keeps each image's aspect ratio within ``MAX_SOFT_TOKENS`` image tokens (a square one
is 8 x 8 = 64; a 130 x 90 one 54), each image ``<|image>``, its tokens, ``<image|>``. Written by
``vlm_maker.make_vlm(arch="gemma4")``.

``arch="gemma4_bidirectional"`` writes the same model with ``use_bidirectional_attention:
vision`` (the larger real ones): each image's tokens attend each other both ways in prefill.

Not in it (see docs/decisions/0005): K/V shared across layers (``num_kv_shared_layers``: the
paged pool holds no shared layers, so the real E2B / E4B go to the runner on the model's own
caches, text only).
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
POOLING = 2  # 2 x 2 patches pooled into one image token of 8 x 8 pixels
MAX_SOFT_TOKENS = 64  # image tokens an image at most (its pixels scaled to fit)
WINDOW = 16  # the window layer's keys: shorter than a prompt, so slabs go back
IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN = "<|image|>", "<|image>", "<image|>"
AUDIO_TOKEN, VIDEO_TOKEN = "<|audio|>", "<|video|>"  # named, never used (images only)
TOKEN_IDS = {
    t: TRAINED_VOCAB_SIZE + n
    for n, t in enumerate((IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN, AUDIO_TOKEN, VIDEO_TOKEN))
}
VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
PER_LAYER_INPUT = 16  # each layer's own slice of the per-layer embedding table
# Gemma ties its output head to the embeddings: random ones as large as the other weights carry
# each token into its own logits (every greedy answer one token repeated); smaller ones vary.
_EMBED_SCALE = 0.1
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}{%- endif -%}"
)


# Public API


def gemma4_config(both_ways: bool = False) -> dict[str, Any]:
    """The checkpoint's ``config.json``; ``both_ways``: image tokens attend each other both
    ways (``use_bidirectional_attention: vision``)."""
    text = {
        **TINY_SHAPE,
        "model_type": "gemma4_text",
        "vocab_size": VOCAB_SIZE,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "hidden_size_per_layer_input": PER_LAYER_INPUT,
        "global_head_dim": 2 * TINY_SHAPE["head_dim"],  # the full layer's heads are wider
        "num_kv_shared_layers": 0,
        "rms_norm_eps": 1e-6,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": WINDOW,
        "final_logit_softcapping": 30.0,
        "use_bidirectional_attention": "vision" if both_ways else None,
        "tie_word_embeddings": True,
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "patch_size": PATCH_SIZE,
        "pooling_kernel_size": POOLING,
        "default_output_length": MAX_SOFT_TOKENS,
        "position_embedding_size": 64,
    }
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "image_token_id": TOKEN_IDS[IMAGE_TOKEN],
        "boi_token_id": TOKEN_IDS[BOI_TOKEN],
        "eoi_token_id": TOKEN_IDS[EOI_TOKEN],
        "audio_token_id": TOKEN_IDS[AUDIO_TOKEN],
        "video_token_id": TOKEN_IDS[VIDEO_TOKEN],
        "vision_soft_tokens_per_image": MAX_SOFT_TOKENS,
        "hidden_size": TINY_SHAPE["hidden_size"],
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": [EOS_TOKEN_ID],
        "pad_token_id": PAD_TOKEN_ID,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def build_gemma4_bidirectional(out_dir: Path, seed: int, report: Progress) -> None:
    """``build_gemma4``'s checkpoint (the same seed, the same weights) whose image tokens attend
    each other both ways."""
    build_gemma4(out_dir, seed, report, both_ways=True)


def build_gemma4(out_dir: Path, seed: int, report: Progress, both_ways: bool = False) -> None:
    """Write the checkpoint into the (staged, empty) ``out_dir``."""
    from mlx_vlm.models import gemma4

    train_tokenizer(out_dir, VOCAB_SIZE, report)
    _add_image_tokens(out_dir)
    files = {"processor_config.json": _processor()}
    config = gemma4_config(both_ways)
    write_checkpoint(out_dir, gemma4, config, seed, report, files, _scale_embeddings)


# Internal helpers


def _add_image_tokens(out_dir: Path) -> None:
    """The first reserved tokens become Gemma 4's image tokens (special, never split), named in
    the tokenizer's config as its processor reads them (``tokenizer.image_token``, ...); the chat
    template renders an image part as ``<|image|>``, which the processor expands."""
    names = {
        "image_token": IMAGE_TOKEN,
        "boi_token": BOI_TOKEN,
        "eoi_token": EOI_TOKEN,
        "audio_token": AUDIO_TOKEN,
        "video_token": VIDEO_TOKEN,
    }
    add_image_tokens(out_dir, TOKEN_IDS, _IMAGE_PART, "Gemma4Processor", names)


def _scale_embeddings(model: Any) -> None:
    """The tied embeddings at ``_EMBED_SCALE`` of the other weights' scale."""
    decoder = model.language_model.model
    decoder.embed_tokens.weight = decoder.embed_tokens.weight * _EMBED_SCALE


def _processor() -> dict[str, Any]:
    """Gemma 4's (flat, as mlx-vlm's processor reads it): each image scaled, aspect kept, to at
    most ``MAX_SOFT_TOKENS`` pooled patches, normalized to [-1, 1]."""
    return {
        "processor_class": "Gemma4Processor",
        "patch_size": PATCH_SIZE,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOLING,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
