"""The vision-language model maker: a tiny mlx-vlm checkpoint with seeded random weights.

A made VLM is what a downloaded one is to mlx-vlm's ``load``: ``config.json`` with a
``text_config`` and a ``vision_config``, the weights, the tokenizer (the text maker's, with the
family's image tokens in place of reserved ones) and the processor's own files
(``preprocessor_config.json``, ``processor_config.json``), all written offline. Families:
LLaVA 1.5 (CLIP, a projector, Llama) and Gemma 3 (SigLIP, pooled to ``mm_tokens_per_image``,
a language model of window and full layers); the other families' makers (``*_maker.py``) share
its tail, ``train_tokenizer`` and ``write_checkpoint``. Needs the ``vision`` extra (mlx-vlm),
imported only here and in the worker's vision package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError
from mlxd.models.maker import Progress, init_weights, print_stderr, staged_dir
from mlxd.models.presets import TINY_SHAPE
from mlxd.models.tokenizer_maker import (
    CHAT_TEMPLATE,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    RESERVED_TOKEN,
    TRAINED_VOCAB_SIZE,
    make_tokenizer,
)

VLM_ARCHS = (
    "llava",
    "gemma3",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5_vl",
    "qwen3_5_moe_vl",
)
VLM_ARCHS += ("smolvlm", "idefics3")  # smolvlm_maker.py
VLM_ARCHS += ("mistral3",)  # mistral3_maker.py
VLM_ARCHS += ("llama4",)  # llama4_maker.py
VLM_ARCHS += ("gemma4", "gemma4_bidirectional")  # gemma4_maker.py
IMAGE_TOKEN = "<image>"
# One reserved id past the trained vocabulary becomes the image token; the rest stay reserved.
VLM_VOCAB_SIZE = TRAINED_VOCAB_SIZE + 64
IMAGE_TOKEN_ID = TRAINED_VOCAB_SIZE
# 112 x 112 pixels in 14-pixel patches: 64 image tokens, two KV blocks of the default size.
IMAGE_SIZE = 112
PATCH_SIZE = 14
# CLIP's normalization (the processor's; any fixed values would do for random weights).
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Gemma 3: 64 x 64 pixels in 4-pixel patches (16 x 16), average-pooled to 8 x 8 = 64 image
# tokens per image (two KV blocks of the default size), each between its begin and end tokens.
GEMMA3_IMAGE_SIZE = 64
GEMMA3_PATCH_SIZE = 4
GEMMA3_IMAGE_TOKENS = 64
GEMMA3_WINDOW = 16  # the window layers' keys: shorter than a block, so slabs go back
GEMMA3_BOI_TOKEN = "<start_of_image>"
GEMMA3_IMAGE_TOKEN = "<image_soft_token>"
GEMMA3_EOI_TOKEN = "<end_of_image>"
_GEMMA3_EMBED_SCALE = 0.1  # of the other weights' scale (see _build_gemma3)
# Reserved ids past the trained vocabulary become Gemma 3's image tokens.
GEMMA3_TOKEN_IDS = {
    t: TRAINED_VOCAB_SIZE + n
    for n, t in enumerate((GEMMA3_IMAGE_TOKEN, GEMMA3_BOI_TOKEN, GEMMA3_EOI_TOKEN))
}

# The chat template's content macro, which gains image parts (rendered as the image token).
_TEXT_PART = "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
_IMAGE_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}{%- endif -%}"
)
# Gemma 3's template renders an image part as its begin token (the processor expands it).
_GEMMA3_IMAGE_PART = _IMAGE_PART.replace(IMAGE_TOKEN, GEMMA3_BOI_TOKEN)


# Public API


def make_vlm(
    out_dir: Path,
    *,
    arch: str = "llava",
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a tiny mlx-vlm model directory of family ``arch`` with seeded random weights.

    Raises:
        ConfigError: Unknown family, ``out_dir`` exists, or mlx-vlm is not installed.
    """
    if arch not in VLM_ARCHS:
        raise ConfigError(f"unknown vision family {arch!r}; valid: {', '.join(VLM_ARCHS)}")
    _require_mlx_vlm()
    report = progress or print_stderr
    with staged_dir(Path(out_dir), overwrite) as tmp_dir:
        _builder(arch)(tmp_dir, seed, report)
    report(f"made {arch} vision model in {out_dir}")
    return out_dir


def train_tokenizer(out_dir: Path, vocab_size: int, report: Progress) -> None:
    """The text maker's tokenizer at ``vocab_size`` (its reserved ids become the family's
    image tokens next), its context the tiny shape's."""
    report(f"training tokenizer (vocab {vocab_size})")
    make_tokenizer(
        out_dir, vocab_size=vocab_size, model_max_length=TINY_SHAPE["max_position_embeddings"]
    )


def write_checkpoint(
    out_dir: Path,
    family: Any,
    config: dict[str, Any],
    seed: int,
    report: Progress,
    files: dict[str, dict[str, Any]],
    adjust: Callable[[Any], None] | None = None,
) -> None:
    """Build mlx-vlm ``family``'s model from ``config`` with seeded random float32 weights
    (``adjust`` changes it before it is saved), then save it beside ``config.json`` and the
    processor's ``files`` (name: contents)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_model

    # A copy: building the model must not change the config.json written below.
    model = family.Model(_model_config(family, json.loads(json.dumps(config))))
    num_params = sum(p.size for _, p in tree_flatten(model.parameters()))
    report(f"initialising {num_params / 1e6:.2f}M random float32 weights (seed {seed})")
    init_weights(model, seed, mx.float32, max(0.02, TINY_SHAPE["hidden_size"] ** -0.5))
    if adjust is not None:
        adjust(model)
    save_model(out_dir, model, donate_model=True)
    write_json(out_dir / "config.json", config)
    for name, data in files.items():
        write_json(out_dir / name, data)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def special_token(token: str, token_id: int) -> dict[str, Any]:
    """``token``'s entry in ``tokenizer.json``'s ``added_tokens``: special, never split."""
    return {
        "id": token_id,
        "content": token,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def llava_config() -> dict[str, Any]:
    """LLaVA 1.5's layout at the tiny shape: a CLIP tower, a two-layer projector, Llama."""
    text = {
        **{k: v for k, v in TINY_SHAPE.items() if k != "head_dim"},  # llava derives it
        "model_type": "llama",
        "vocab_size": VLM_VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10_000.0,
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "projection_dim": 32,
        "num_channels": 3,
        "layer_norm_eps": 1e-5,
    }
    return {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": IMAGE_TOKEN_ID,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "vocab_size": VLM_VOCAB_SIZE,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "max_position_embeddings": text["max_position_embeddings"],
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def gemma3_config() -> dict[str, Any]:
    """Gemma 3's layout at the tiny shape: a SigLIP tower pooled to ``GEMMA3_IMAGE_TOKENS``
    per image, a language model whose layers alternate sliding-window and full attention
    (the window shorter than a prompt, so the window runner's slabs go back)."""
    text = {
        **TINY_SHAPE,
        "model_type": "gemma3_text",
        "vocab_size": VLM_VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": TINY_SHAPE["head_dim"],
        "sliding_window": GEMMA3_WINDOW,
        "sliding_window_pattern": 2,  # window, full
        "mm_tokens_per_image": GEMMA3_IMAGE_TOKENS,
        "rope_local_base_freq": 10_000.0,
        "rope_global_base_freq": 1_000_000.0,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "image_size": GEMMA3_IMAGE_SIZE,
        "patch_size": GEMMA3_PATCH_SIZE,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
    }
    return {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "image_token_index": GEMMA3_TOKEN_IDS[GEMMA3_IMAGE_TOKEN],
        "boi_token_index": GEMMA3_TOKEN_IDS[GEMMA3_BOI_TOKEN],
        "eoi_token_index": GEMMA3_TOKEN_IDS[GEMMA3_EOI_TOKEN],
        "mm_tokens_per_image": GEMMA3_IMAGE_TOKENS,
        "hidden_size": text["hidden_size"],  # mlx-vlm scales image features by it
        "vocab_size": VLM_VOCAB_SIZE,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "max_position_embeddings": text["max_position_embeddings"],
        "torch_dtype": "float32",
        "transformers_version": "5.0.0",
        "text_config": text,
        "vision_config": vision,
    }


def add_image_tokens(
    out_dir: Path,
    token_ids: dict[str, int],
    image_part: str,
    processor_class: str,
    names: dict[str, str] | None = None,
) -> None:
    """The first reserved tokens become ``token_ids`` (special, never split); the chat template
    renders an image part as ``image_part`` (a replacement of the text-only template's content
    macro); the tokenizer's config names the processor and, ``names``, the tokens it reads
    (``tokenizer.boi_token``, ...)."""
    path = out_dir / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    for n, (token, token_id) in enumerate(token_ids.items()):
        assert vocab.pop(RESERVED_TOKEN.format(n)) == token_id
        vocab[token] = token_id
        spec["added_tokens"].append(special_token(token, token_id))
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    assert _TEXT_PART in CHAT_TEMPLATE
    config["chat_template"] = CHAT_TEMPLATE.replace(_TEXT_PART, image_part)
    config["processor_class"] = processor_class
    if names is not None:
        config["extra_special_tokens"] = names
    write_json(config_path, config)


# Internal helpers


def _builder(arch: str) -> Any:
    """The function that writes family ``arch``'s checkpoint into a directory."""
    if arch in ("gemma4", "gemma4_bidirectional"):
        from mlxd.models import gemma4_maker

        return getattr(gemma4_maker, f"build_{arch}")
    if arch == "llama4":
        from mlxd.models.llama4_maker import build_llama4

        return build_llama4
    if arch == "mistral3":
        from mlxd.models.mistral3_maker import build_mistral3

        return build_mistral3
    if arch in ("smolvlm", "idefics3"):
        from mlxd.models import smolvlm_maker

        return getattr(smolvlm_maker, f"build_{arch}")
    if arch == "qwen2_5_vl":
        from mlxd.models.qwen_vl_maker import build_qwen2_5_vl

        return build_qwen2_5_vl
    if arch in ("qwen3_vl", "qwen3_vl_moe"):
        from mlxd.models import qwen3_vl_maker

        return getattr(qwen3_vl_maker, f"build_{arch}")
    if arch in ("qwen3_5_vl", "qwen3_5_moe_vl"):
        from mlxd.models import qwen35_vl_maker

        return getattr(qwen35_vl_maker, f"build_{arch}")
    return _build_gemma3 if arch == "gemma3" else _build_llava


def _require_mlx_vlm() -> None:
    import importlib.util

    if importlib.util.find_spec("mlx_vlm") is None:
        raise ConfigError("vision models need mlx-vlm: pip install 'mlxd[vision]'")


def _build_llava(out_dir: Path, seed: int, report: Progress) -> None:
    from mlx_vlm.models import llava

    train_tokenizer(out_dir, VLM_VOCAB_SIZE, report)
    add_image_tokens(out_dir, {IMAGE_TOKEN: IMAGE_TOKEN_ID}, _IMAGE_PART, "LlavaProcessor")
    processor = {
        "processor_class": "LlavaProcessor",
        "patch_size": PATCH_SIZE,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,  # CLIP's class token, dropped by "default"
        "image_token": IMAGE_TOKEN,
    }
    files = {"preprocessor_config.json": _clip_preprocessor(), "processor_config.json": processor}
    write_checkpoint(out_dir, llava, llava_config(), seed, report, files)


def _build_gemma3(out_dir: Path, seed: int, report: Progress) -> None:
    from mlx_vlm.models import gemma3

    train_tokenizer(out_dir, VLM_VOCAB_SIZE, report)
    _add_gemma3_tokens(out_dir)
    files = {
        "preprocessor_config.json": _gemma3_preprocessor(),
        "processor_config.json": {
            "processor_class": "Gemma3Processor",
            "image_seq_length": GEMMA3_IMAGE_TOKENS,
        },
    }
    write_checkpoint(out_dir, gemma3, gemma3_config(), seed, report, files, _tie_gemma3_head)


def _tie_gemma3_head(model: Any) -> None:
    """Gemma 3 ties its output head to the embeddings (mlx-vlm's load ties it whatever the
    file holds): random embeddings as large as the rest would carry each token into its own
    logits and a greedy answer would repeat one token. Smaller ones leave it to the layers."""
    text = model.language_model
    text.model.embed_tokens.weight = text.model.embed_tokens.weight * _GEMMA3_EMBED_SCALE
    text.pop("lm_head")  # tied: no weights of its own in the checkpoint


def _model_config(family: Any, config: dict[str, Any]) -> Any:
    """The family's ``ModelConfig`` with its text and vision configs built, as mlx-vlm's
    ``load`` builds them (``from_dict`` leaves nested configs as dicts)."""
    from mlx_vlm.utils import update_module_configs

    model_config = family.ModelConfig.from_dict(config)
    return update_module_configs(model_config, family, config, ["text", "vision"])


def _add_gemma3_tokens(out_dir: Path) -> None:
    """Gemma 3's image tokens in the first reserved ids, named as its processor reads them."""
    names = {
        "image_token": GEMMA3_IMAGE_TOKEN,
        "boi_token": GEMMA3_BOI_TOKEN,
        "eoi_token": GEMMA3_EOI_TOKEN,
    }
    add_image_tokens(out_dir, GEMMA3_TOKEN_IDS, _GEMMA3_IMAGE_PART, "Gemma3Processor", names)


def _gemma3_preprocessor() -> dict[str, Any]:
    """Gemma 3's: a square resize to the tower's side, normalized to [-1, 1], no crops."""
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_resize": True,
        "size": {"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
        "do_pan_and_scan": False,
    }


def _clip_preprocessor() -> dict[str, Any]:
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": IMAGE_SIZE},
        "do_center_crop": True,
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
        "do_convert_rgb": True,
        "resample": 3,
    }
