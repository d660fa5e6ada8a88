"""Random-weight models of real hybrid and sliding-window shapes, for the prefix benchmarks.

    python bench/make_shaped.py NAME OUT_DIR [--dtype bfloat16] [--layers N]

NAME: ``qwen3_5-0.8b`` (Qwen3.5-0.8B's dimensions: 24 layers, three Gated DeltaNet layers to
one gated full-attention layer; the linear-attention head counts are our assumption) or
``gemma3-1b`` (Gemma-3-1B's: 26 layers, five 512-token sliding-window layers to one global).
``--layers`` shrinks the depth (a CPU check of the same shape).
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
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args()
    config = copy.deepcopy(SHAPES[args.name])
    if args.layers:
        config["num_hidden_layers"] = args.layers
    config.update(eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID)
    write_model(args.out, config, dtype=args.dtype, overwrite=True, progress=print)


if __name__ == "__main__":
    main()
