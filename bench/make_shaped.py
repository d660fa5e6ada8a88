"""Random-weight models of real hybrid and sliding-window shapes, for the prefix benchmarks.

    python bench/make_shaped.py NAME OUT_DIR [--dtype bfloat16] [--layers N]

NAME: ``qwen3_5-0.8b`` (Qwen3.5-0.8B's dimensions: 24 layers, three Gated DeltaNet layers to
one gated full-attention layer; the linear-attention head counts are our assumption) or
``gemma3-1b`` (Gemma-3-1B's: 26 layers, five 512-token sliding-window layers to one global),
``qwen3_moe-30b-a3b`` (Qwen3-30B-A3B's: 48 layers of 128 experts, 8 active) or ``qwen3-32b``
(Qwen3-32B's: 64 layers, hidden 5120), or ``qwen3_5-0.8b-vl`` (the Qwen3.5-0.8B hybrid with its
vision tower, an mlx-vlm checkpoint: 12 ViT layers of width 768, our reading of the real one's;
a 448 x 448 image is 196 image tokens). ``--layers`` shrinks the depth (a CPU check of the same
shape); ``--quantize 4`` draws 4-bit codes directly (the 30B/32B shapes need no bf16 copy).
``--tiny`` keeps the layer pattern (one period of it) and the routing but shrinks every width and
the vocabulary, so a CPU can serve the class in a benchmark harness's check.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mlxd.models.maker import write_model
from mlxd.models.tokenizer_maker import EOS_TOKEN_ID, PAD_TOKEN_ID

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_5-0.8b": {
        "model_type": "qwen3_5",
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "intermediate_size": 3584,
        "vocab_size": 248320,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "full_attention_interval": 4,
        "linear_num_value_heads": 16,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    "gemma3-1b": {
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 6912,
        "vocab_size": 262144,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 256,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "qwen3_moe-30b-a3b": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "model_type": "qwen3",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 25600,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
}


# --tiny's widths: small enough for a 2-core CPU, wide enough for every head count to divide.
TINY: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 8192,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "sliding_window": 64,
    "query_pre_attn_scalar": 32,
}


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """The same class at TINY's widths, one period of its layer pattern deep."""
    small = {**config, **{k: v for k, v in TINY.items() if k in config}}
    period = config.get("full_attention_interval") or config.get("sliding_window_pattern") or 2
    small["num_hidden_layers"] = period
    return small


# Qwen3.5-0.8B's vision tower (about 0.1B parameters, ending in the text model's width).
VL_VISION = {
    "depth": 12,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_heads": 12,
    "out_hidden_size": 1024,
    "num_position_embeddings": 2304,
}
VL_TEXT_KEYS = (  # what the VLM's text config takes from the text shape
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "full_attention_interval",
    "linear_num_value_heads",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "tie_word_embeddings",
)
VL_MAX_PIXELS = 1024 * 1024  # a 448 x 448 image keeps its size


def make_vl(out: Path, dtype: str, layers: int | None, tiny_: bool) -> None:
    """The VLM shape: mlxd's tiny Qwen3.5 maker for the tokenizer and processor files, then
    (unless ``tiny_``) the real widths and random weights in ``dtype``."""
    from mlxd.models.vlm_maker import make_vlm

    with tempfile.TemporaryDirectory() as tmp:
        made = make_vlm(Path(tmp) / "m", arch="qwen3_5_vl", progress=print)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(made, out)
    if not tiny_:
        config = _vl_config(json.loads((out / "config.json").read_text()), layers)
        _vl_weights(out, config, dtype)
        (out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        pre = json.loads((out / name).read_text())
        pre["max_pixels"] = VL_MAX_PIXELS
        (out / name).write_text(json.dumps(pre, indent=1))


def _vl_config(config: dict[str, Any], layers: int | None) -> dict[str, Any]:
    shape = SHAPES["qwen3_5-0.8b"]
    text = config["text_config"]
    text.update({k: shape[k] for k in VL_TEXT_KEYS})
    text["num_hidden_layers"] = layers or text["num_hidden_layers"]
    rope = {**shape["rope_parameters"], "mrope_interleaved": True, "mrope_section": [11, 11, 10]}
    text["rope_parameters"] = rope
    config["vision_config"].update(VL_VISION)
    config.update(vocab_size=shape["vocab_size"], tie_word_embeddings=True)
    return config


def _vl_weights(out: Path, config: dict[str, Any], dtype: str) -> None:
    import mlx.core as mx
    from mlx_lm.utils import save_model
    from mlx_vlm.models import qwen3_5

    from mlxd.models.maker import init_weights
    from mlxd.models.vlm_maker import _model_config

    for old in out.glob("model*.safetensors*"):
        old.unlink()
    model = qwen3_5.Model(_model_config(qwen3_5, json.loads(json.dumps(config))))
    init_weights(model, 0, getattr(mx, dtype), config["text_config"]["hidden_size"] ** -0.5)
    save_model(out, model, donate_model=True)
    print(f"made qwen3_5-0.8b-vl ({dtype}) in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=[*sorted(SHAPES), "qwen3_5-0.8b-vl"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--quantize", type=int, choices=(4, 8), default=None)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    if args.name == "qwen3_5-0.8b-vl":
        make_vl(args.out, args.dtype, args.layers, args.tiny)
        return
    config = copy.deepcopy(SHAPES[args.name])
    if args.tiny:
        config = tiny(config)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    config.update(eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID)
    write_model(
        args.out,
        config,
        dtype=args.dtype,
        quantize_bits=args.quantize,
        draw_codes=True,
        overwrite=True,
        progress=print,
    )


if __name__ == "__main__":
    main()
