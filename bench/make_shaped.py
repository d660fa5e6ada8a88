"""Random-weight models of real hybrid and sliding-window shapes, for the prefix benchmarks.

    python bench/make_shaped.py NAME OUT_DIR [--dtype bfloat16] [--layers N]

NAME: ``qwen3_5-0.8b`` (Qwen3.5-0.8B's dimensions: 24 layers, three Gated DeltaNet layers to
one gated full-attention layer; the linear-attention head counts are our assumption) or
``gemma3-1b`` (Gemma-3-1B's: 26 layers, five 512-token sliding-window layers to one global),
``qwen3_moe-30b-a3b`` (Qwen3-30B-A3B's: 48 layers of 128 experts, 8 active) or ``qwen3-32b``
(Qwen3-32B's: 64 layers, hidden 5120). ``--layers`` shrinks the depth (a CPU check of the same
shape); ``--quantize 4`` draws 4-bit codes directly (the 30B/32B shapes need no bf16 copy).
``--tiny`` keeps the layer pattern (one period of it) and the routing but shrinks every width and
the vocabulary, so a CPU can serve the class in a benchmark harness's check.
"""

from __future__ import annotations

import argparse
import copy
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--quantize", type=int, choices=(4, 8), default=None)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
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
