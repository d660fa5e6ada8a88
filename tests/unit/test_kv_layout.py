"""The one KV sizing rule: bytes of K/V per token from a ``config.json`` and ``--kv-bits``."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.models.kv_layout import KVLayout, config_token_bytes, from_config, row_bytes

# Qwen3-0.6B's attention: 28 layers, 8 KV heads of 128, bfloat16
QWEN3_06B = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
    "torch_dtype": "bfloat16",
}
FLOAT = 28 * 8 * 2 * 128 * 2


def test_float_kv_is_layers_heads_keys_and_values_in_the_dtype() -> None:
    assert config_token_bytes(QWEN3_06B) == FLOAT
    assert config_token_bytes(QWEN3_06B, dtype_bytes=4) == 2 * FLOAT


@pytest.mark.parametrize(("bits", "low", "high"), [(4, 0.25, 0.29), (8, 0.5, 0.54)])
def test_quantized_kv_is_about_bits_over_16_of_float16(bits: int, low: float, high: float) -> None:
    """Packed words, and a half-precision scale and bias per 64 values (``mx.quantize``)."""
    quantized = config_token_bytes(QWEN3_06B, bits=bits, group_size=64)
    assert quantized == 28 * 8 * 2 * (128 * bits // 8 + 2 * 2 * 2)
    assert low <= quantized / FLOAT <= high


def test_scales_and_biases_take_the_compute_dtype_per_group() -> None:
    assert row_bytes(128, 2, 4, 32) == 64 + 2 * 4 * 2
    assert row_bytes(128, 4, 4, 128) == 64 + 2 * 1 * 4
    assert row_bytes(128, 4) == 512


def test_blocks_are_block_size_tokens() -> None:
    layout = KVLayout(layers=2, heads=4, key_dim=64, value_dim=64, dtype_bytes=2)
    assert layout.block_bytes(16, 4) == 16 * layout.token_bytes(4)


def test_head_dim_defaults_to_hidden_over_heads_and_heads_to_attention_heads() -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    config["torch_dtype"] = "float32"
    assert from_config(config) == [KVLayout(2, 4, 16, 16, 4)]


def test_a_vision_models_text_config_holds_its_attention() -> None:
    assert config_token_bytes({"text_config": QWEN3_06B, "vision_config": {}}) == FLOAT


HYBRIDS = [  # every fourth of 28 layers attends; the others keep a fixed state, or none
    {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 7},  # Qwen3-Next, Qwen3.5
    {"full_attention_interval": 4},  # Qwen3-Next without layer_types
    {"layer_types": ["conv", "conv", "full_attention", "conv"] * 7},  # LFM2
    {"full_attn_idxs": list(range(3, 28, 4))},  # LFM2 without layer_types
    {"hybrid_override_pattern": "MM-*" * 7},  # Nemotron-H: "*" attends, "M" Mamba, "-" an MLP
    {"attn_layer_period": 4, "attn_layer_offset": 3},  # Jamba
    {"linear_attn_config": {"kda_layers": [i for i in range(1, 29) if i % 4]}},  # Kimi Linear
    {"layer_group_size": 4},  # Bailing linear: the last layer of each group attends
]


@pytest.mark.parametrize("hybrid", HYBRIDS)
def test_a_hybrids_recurrent_layers_keep_no_per_token_kv(hybrid: dict[str, Any]) -> None:
    assert config_token_bytes({**QWEN3_06B, **hybrid}) == FLOAT // 4


def test_sliding_window_layers_count_as_the_pool_pays_their_slabs() -> None:
    """Their slabs come from the same budget, one beside each block (worker/kv/window_slabs.py)."""
    layer_types = ["sliding_attention", "full_attention"] * 14
    windowed = {**QWEN3_06B, "sliding_window": 512, "layer_types": layer_types}
    assert config_token_bytes(windowed) == FLOAT


def test_layers_sharing_anothers_kv_keep_none() -> None:
    assert config_token_bytes({**QWEN3_06B, "num_kv_shared_layers": 14}) == FLOAT // 2


def test_mla_keeps_one_latent_row_and_its_rotary_part() -> None:
    """DeepSeek V3's cache in mlx-lm: keys (1 head, kv_lora_rank), values (1, qk_rope_head_dim)."""
    mla = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
    config = {**QWEN3_06B, "num_hidden_layers": 61, "num_key_value_heads": 128, **mla}
    assert from_config(config) == [KVLayout(61, 1, 512, 64, 2)]
    assert config_token_bytes(config) == 61 * (512 + 64) * 2


def test_separate_key_and_value_head_dims() -> None:
    config = {**QWEN3_06B, "head_dim": 192, "v_head_dim": 128}
    assert config_token_bytes(config) == 28 * 8 * (192 + 128) * 2


def test_a_model_without_attention_keeps_none() -> None:
    mamba = {"model_type": "mamba", "num_hidden_layers": 24, "hidden_size": 768}
    assert config_token_bytes(mamba) == 0


def test_mla_as_deepseek_v2_keeps_every_heads_keys_and_values() -> None:
    mla = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
    config = {**QWEN3_06B, "model_type": "deepseek_v2", "num_key_value_heads": 16, **mla}
    assert from_config(config) == [KVLayout(28, 16, 192, 128, 2)]


def test_gemma4s_full_layers_take_their_own_head_shape() -> None:
    layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    gemma4 = {**QWEN3_06B, "num_hidden_layers": 30, "layer_types": layer_types * 5}
    gemma4 |= {"global_head_dim": 512, "attention_k_eq_v": True, "num_global_key_value_heads": 2}
    gemma4["num_kv_shared_layers"] = 12  # the last 12 layers: 10 window, 2 full
    assert from_config(gemma4) == [KVLayout(15, 8, 128, 128, 2), KVLayout(3, 2, 512, 512, 2)]
