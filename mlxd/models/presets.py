"""Architecture presets: (arch, size) -> an mlx-lm ``config.json`` dict.

``tiny``, ``small`` and ``deep`` exist for every arch and use the trained tokenizer's
vocabulary, so they run fast on a CPU. ``deep`` is ``tiny`` with Qwen3-0.6B's 28 layers: as many
kernels per decode step as the real model and little arithmetic, a CPU stand-in for a GPU's
launch-bound small-batch decode. The named sizes copy the true dimensions of released
checkpoints, vocabulary included, so random weights cost the same compute as the real model.
"""

from __future__ import annotations

import copy
from typing import Any

from mlxd.errors import ConfigError
from mlxd.models.tokenizer_maker import EOS_TOKEN_ID, PAD_TOKEN_ID, TRAINED_VOCAB_SIZE

ARCHS = ("qwen3", "llama", "qwen2", "mistral", "mamba", "lfm2")

# Fields every checkpoint of the arch shares. transformers_version >= 5 tells transformers the
# tokenizer needs no Mistral regex fix (it warns on model_type mistral otherwise).
_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "transformers_version": "5.0.0",
}
_ARCH_BASE: dict[str, dict[str, Any]] = {
    # A state-space model: recurrent state per layer instead of a KV cache (mlx-lm's
    # ArraysCache); the generic shapes' attention fields are ignored.
    # A hybrid: short-convolution layers with recurrent state between attention layers
    # (``layer_types`` alternate, see model_config).
    "lfm2": {
        "model_type": "lfm2",
        "architectures": ["Lfm2ForCausalLM"],
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "tie_word_embeddings": True,
    },
    "mamba": {
        "model_type": "mamba",
        "architectures": ["MambaForCausalLM"],
        "state_size": 16,
        "conv_kernel": 4,
        "time_step_rank": 8,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0,
        "tie_word_embeddings": True,
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    # mlx-lm maps model_type mistral onto its llama module.
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 1_000_000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
}

# The tiny shape of every preset and of the zoo's models (mlxd/models/zoo.py).
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": TRAINED_VOCAB_SIZE,
    "max_position_embeddings": 4096,
}

# qwen2 derives head_dim as hidden_size // num_attention_heads, so shapes keep that identity.
_GENERIC_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": TINY_SHAPE,
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 768,
        "vocab_size": TRAINED_VOCAB_SIZE,
        "max_position_embeddings": 8192,
    },
}
_GENERIC_SHAPES["deep"] = {**_GENERIC_SHAPES["tiny"], "num_hidden_layers": 28}

# Llama 3.2 stretches an 8k-trained rope to 128k. Real shapes only: transformers warns when
# max_position_embeddings is below the original 8192, as it is for tiny.
_LLAMA3_ROPE_SCALING = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

# The dimensions of the released checkpoints' config.json files.
_REAL_SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3": {
        "qwen3-0.6b": {
            "hidden_size": 1024,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
        },
        "qwen3-1.7b": {
            "hidden_size": 2048,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 6144,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
        },
    },
    "llama": {
        "llama-3.2-1b": {
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "intermediate_size": 8192,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rope_scaling": _LLAMA3_ROPE_SCALING,
        },
        "llama-3.2-3b": {
            "hidden_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 8192,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rope_scaling": _LLAMA3_ROPE_SCALING,
        },
    },
}


def sizes(arch: str) -> tuple[str, ...]:
    """The sizes that exist for ``arch`` (empty for an unknown arch)."""
    if arch not in _ARCH_BASE:
        return ()
    return (*_GENERIC_SHAPES, *_REAL_SHAPES.get(arch, {}))


def model_config(arch: str, size: str) -> dict[str, Any]:
    """A fresh config.json dict for one preset.

    Args:
        arch: One of ``ARCHS``.
        size: ``tiny``, ``small`` or a real shape of that arch, e.g. ``qwen3-0.6b``.

    Returns:
        A new dict the caller may change.

    Raises:
        ConfigError: The arch/size pair does not exist; the message lists the valid ones.
    """
    shape = _GENERIC_SHAPES.get(size) or _REAL_SHAPES.get(arch, {}).get(size)
    if arch not in _ARCH_BASE or shape is None:
        raise ConfigError(f"unknown model preset {arch}/{size}; valid: {_valid_choices()}")
    config = copy.deepcopy({**_COMMON, **_ARCH_BASE[arch], **shape})
    if arch == "lfm2":  # its block size is the hidden size; layers alternate conv / attention
        config["block_dim"] = config["hidden_size"]
        alternate_layer_types(config, "conv", "full_attention")
    return config


def _valid_choices() -> str:
    return "; ".join(f"--arch {arch} --size {'|'.join(sizes(arch))}" for arch in ARCHS)


def alternate_layer_types(config: dict[str, Any], first: str, second: str) -> None:
    """``config["layer_types"]``: ``first``, ``second``, ``first``, … for every layer."""
    kinds = (first, second)
    config["layer_types"] = [kinds[i % 2] for i in range(config["num_hidden_layers"])]
