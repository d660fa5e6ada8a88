"""The zoo: a tiny config for every text architecture in the installed mlx-lm.

Each entry is what one ``mlx_lm.models.<arch>`` needs on top of ``_BASE`` to build, sized so it
runs in milliseconds on a CPU, with *every layer kind of that architecture present*: sliding and
global attention, recurrent and attention layers of hybrids, dense and MoE feed-forwards, KV-sharing
layers. Sliding windows are 8 tokens, so a 50-token prompt crosses them. Wrapper models that
mlx-lm loads as text only (gemma3, mistral3, qwen3_5, ...) nest the text model under
``text_config``. The vocabulary is the maker's trained tokenizer's, so every sampled id decodes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError
from mlxd.models.presets import TINY_SHAPE
from mlxd.models.tokenizer_maker import EOS_TOKEN_ID, PAD_TOKEN_ID, TRAINED_VOCAB_SIZE

WINDOW = 8  # sliding-window and chunk size, in tokens
_SW, _FA = "sliding_attention", "full_attention"

# A superset of the common field names: each ModelArgs.from_dict keeps only its own.
_BASE: dict[str, Any] = {
    **TINY_SHAPE,
    "rms_norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "use_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "transformers_version": "5.0.0",
    # MoE: 4 experts, top 2; layer 0 dense where the arch has a dense-prefix switch.
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "shared_expert_intermediate_size": 32,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
    # MLA
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "partial_rotary_factor": 0.5,
}

_MAMBA = {"mamba_d_conv": 4, "mamba_d_state": 8, "mamba_expand": 2}
_LINEAR = {  # gated-delta / linear-attention heads (qwen3_next, qwen3_5, olmo_hybrid)
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}

_YARN = {
    "type": "yarn",
    "factor": 1.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
_M3_ROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "llama_4_scaling_beta": 0.1,
    "original_max_position_embeddings": 4096,
}


_LONGCAT = {  # longcat_flash and its n-gram variant: MLA, zero experts
    "ffn_hidden_size": 128,
    "moe_topk": 2,
    "expert_ffn_hidden_size": 32,
    "zero_expert_num": 2,
    "num_layers": 2,
    "mla_scale_q_lora": True,
    "mla_scale_kv_lora": True,
}


def _text(model_type: str, **text: Any) -> dict[str, Any]:
    return {"text_config": {**_BASE, "model_type": model_type, **text}}


def _dsv3(**extra: Any) -> dict[str, Any]:  # deepseek-v3 style: MLA, dense layer 0, MoE layer 1
    return {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1, **extra}


ZOO: dict[str, dict[str, Any]] = {
    # Plain attention, one kind of layer.
    "apertus": {"post_norm": False, "qk_norm": True},
    "baichuan_m1": {
        "sliding_window": WINDOW,
        "sliding_window_layers": [0],
        "conv_window": 2,
        "tie_word_embeddings": False,
    },
    "cohere": {},
    "exaone": {"num_layers": 2},
    "gemma": {},
    "gemma2": {"query_pre_attn_scalar": 16},
    "glm": {},
    "glm4": {},
    "gpt2": {"n_ctx": 4096, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 4096},
    "gpt_bigcode": {"n_embd": 64, "n_layer": 2, "n_inner": 128, "n_head": 4, "n_positions": 4096},
    "gpt_neox": {"rotary_emb_base": 10000, "rotary_pct": 0.5},
    "gptj": {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 4096, "rotary_dim": 8},
    "granite": {
        "logits_scaling": 1.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
    },
    "helium": {},
    "hunyuan_v1_dense": {},
    "internlm2": {},
    "internlm3": {},
    "lille-130m": {"block_size": 4096, "n_embd": 64, "n_head": 4, "n_kv_heads": 2, "n_layer": 2},
    "mimo": {},
    "minicpm": {
        "dim_model_base": 64,
        "scale_depth": 1.4,
        "scale_emb": 1.0,
        "tie_word_embeddings": False,
    },
    "nanochat": {},
    "nemotron": {"hidden_act": "relu2", "partial_rotary_factor": 0.5},
    "olmo2": {},
    "openelm": {
        "model_dim": 64,
        "num_transformer_layers": 2,
        "ffn_dim_divisor": 16,
        "num_query_heads": [4, 4],
        "num_kv_heads": [2, 2],
        "ffn_multipliers": [2.0, 2.0],
    },
    "phi": {},
    "phi3": {},
    "plamo": {"n_shared_head": 2},
    "qwen": {"kv_channels": 16},
    "qwen2": {"head_dim": 16},
    "qwen3": {},
    "seed_oss": {},
    "stablelm": {"use_qkv_bias": False},
    "starcoder2": {},
    "talkie": {},
    "telechat3": {},
    "youtu_llm": {},
    "ernie4_5": {"use_bias": False},
    # Sliding-window + global attention.
    "cohere2": {"sliding_window": WINDOW, "sliding_window_pattern": 2},
    "exaone4": {
        "sliding_window": WINDOW,
        "sliding_window_pattern": "LG",
        "layer_types": [_SW, _FA],
    },  # transformers reads layer_types, mlx-lm the pattern
    "gemma3_text": {
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
    },
    "gemma4": _text(
        "gemma4_text",
        num_hidden_layers=4,
        layer_types=[_SW, _FA, _SW, _FA],
        num_kv_shared_layers=2,
        sliding_window=WINDOW,
        global_head_dim=32,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=TRAINED_VOCAB_SIZE,
    ),
    "gemma3": {
        **_text(
            "gemma3_text", sliding_window=WINDOW, sliding_window_pattern=2, query_pre_attn_scalar=16
        )
    },
    "llama": {"sliding_window": WINDOW, "layer_types": [_SW, _FA]},
    "ministral3": {
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "rope_parameters": _M3_ROPE,
    },
    "mistral3": _text(
        "ministral3", sliding_window=WINDOW, layer_types=[_SW, _FA], rope_parameters=_M3_ROPE
    ),
    "pixtral": _text("llama", sliding_window=WINDOW, layer_types=[_SW, _FA]),
    "olmo3": {"sliding_window": WINDOW, "layer_types": [_SW, _FA]},
    "plamo3": {"window_size": WINDOW, "sliding_window_pattern": 2},
    "smollm3": {"no_rope_layer_interval": 2},
    "spark2_5": {
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "rope_parameters": {_SW: {"rope_theta": 10000.0}, _FA: {"rope_theta": 10000.0}},
        "hidden_act": "gelu",
    },
    "muse_glimmer": {"sliding_window": WINDOW, "layer_types": [_SW, _FA]},
    "iquestloopcoder": {"loop_window_size": WINDOW},
    "nanbeige": {"num_loops": 2},
    "afm7": {
        "hidden_dim": 64,
        "num_layers": 2,
        "num_kv_reuse_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
    },
    "hunyuan": {
        "moe_topk": 2,
        "num_shared_expert": 1,
        "use_mixed_mlp_moe": True,
        "use_qk_norm": True,
        "use_cla": True,
        "cla_share_factor": 2,
        "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"},
    },
    # MoE (with a dense layer where the arch allows one).
    "Klear": {},
    "bailing_moe": {},
    "dbrx": {
        "d_model": 64,
        "tie_word_embeddings": False,
        "n_layers": 2,
        "n_heads": 4,
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
    },
    "deepseek": {},
    "dots1": {},
    "ernie4_5_moe": {
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_layer_start_index": 1,
        "moe_num_shared_experts": 1,
    },
    "glm4_moe": {"use_qk_norm": True},
    "granitemoe": {
        "logits_scaling": 1.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
    },
    "mixtral": {},
    "olmoe": {},
    "phimoe": {},
    "phixtral": {
        "num_vocab": TRAINED_VOCAB_SIZE,
        "model_dim": 64,
        "num_heads": 4,
        "num_layers": 2,
        "rotary_dim": 8,
    },
    "qwen2_moe": {},
    "qwen3_moe": {},
    "minimax": {"shared_intermediate_size": 32, "rotary_dim": 8},
    "solar_open": {},
    "mellum": {
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "rope_parameters": {
            _SW: {"rope_theta": 10000.0, "rope_type": "default"},
            _FA: {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    "gpt_oss": {"sliding_window": WINDOW, "layer_types": [_SW, _FA], "num_local_experts": 4},
    "afmoe": {"layer_types": [_SW, _FA], "sliding_window": WINDOW, "num_dense_layers": 1},
    "laguna": {
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "mlp_layer_types": ["dense", "sparse"],
    },
    "exaone_moe": {
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "is_moe_layer": [False, True],
    },
    "mimo_v2_flash": {
        "hybrid_layer_pattern": [1, 0],
        "moe_layer_freq": [0, 1],
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "sliding_window_size": WINDOW,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "layernorm_epsilon": 1e-5,
        "swa_rope_theta": 10000.0,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2,
        "v_head_dim": 16,
        "swa_head_dim": 16,
        "swa_v_head_dim": 16,
    },
    "step3p5": {
        "num_attention_groups": 2,
        "sliding_window": WINDOW,
        "layer_types": [_SW, _FA],
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "moe_intermediate_size": 32,
        "share_expert_dim": 32,
        "moe_layers_enum": "1",
    },
    "llama4_text": {"intermediate_size_mlp": 128, "no_rope_layers": [1, 0], "use_qk_norm": True},
    "llama4": _text(
        "llama4_text",
        num_hidden_layers=4,
        attention_chunk_size=WINDOW,
        interleave_moe_layer_step=2,
        intermediate_size_mlp=128,
        num_local_experts=4,
        num_experts_per_tok=1,
        use_qk_norm=True,
    ),
    # MLA.
    "deepseek_v2": {"topk_method": "greedy", "rope_scaling": _YARN},
    "deepseek_v3": _dsv3(),
    "deepseek_v32": _dsv3(index_head_dim=16, index_n_heads=2, index_topk=8),
    "glm4_moe_lite": _dsv3(),
    "glm_moe_dsa": _dsv3(
        index_head_dim=16,
        index_n_heads=2,
        index_topk=8,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    ),
    "kimi_vl": _text("deepseek_v3", **_dsv3()),
    "kimi_k25": _text("kimi_k2", **_dsv3()),
    "minicpm3": {
        "dim_model_base": 64,
        "scale_depth": 1.4,
        "scale_emb": 1.0,
        "rope_scaling": {
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 4,
            "original_max_position_embeddings": 4096,
        },
    },
    "mistral4": _dsv3(rope_parameters=_M3_ROPE),
    "longcat_flash": {**_LONGCAT, "attention_method": "MLA", "zero_expert_type": "identity"},
    "longcat_flash_ngram": {**_LONGCAT, "ngram_vocab_size_ratio": 2},
    # Recurrent only.
    "mamba": {"state_size": 16, "conv_kernel": 4, "time_step_rank": 8, "use_conv_bias": True},
    "mamba2": {
        "num_heads": 8,
        "head_dim": 16,
        "state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_conv_bias": True,
        "time_step_limit": [0.0, 1e9],
        "time_step_rank": 8,
    },
    "rwkv7": {
        "a_low_rank_dim": 8,
        "v_low_rank_dim": 8,
        "gate_low_rank_dim": 8,
        "decay_low_rank_dim": 8,
    },
    # Hybrids: recurrent or linear-attention layers with attention layers.
    "lfm2": {
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "layer_types": ["conv", _FA],
    },
    "lfm2-vl": _text(
        "lfm2",
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=32,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        layer_types=["conv", _FA],
    ),
    "lfm2_moe": {
        "use_expert_bias": True,
        "num_dense_layers": 1,
        "conv_bias": False,
        "conv_L_cache": 3,
        "layer_types": ["conv", _FA, "conv"],
        "num_hidden_layers": 3,
    },
    "gear": {"sliding_window": WINDOW, "layer_types": [_FA, _SW]},
    "falcon_h1": {
        "mamba_d_ssm": 64,
        "mamba_d_head": 16,
        "mamba_n_heads": 4,
        "mamba_d_state": 8,
        "mamba_chunk_size": 16,
    },
    "jamba": {
        **_MAMBA,
        "attn_layer_offset": 1,
        "attn_layer_period": 2,
        "expert_layer_offset": 1,
        "expert_layer_period": 2,
    },
    "granitemoehybrid": {
        "logits_scaling": 1.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "layer_types": ["mamba", "attention"],
        "num_local_experts": 4,
        "shared_intermediate_size": 32,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_expand": 2,
        "mamba_proj_bias": False,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
    },
    "nemotron_h": {
        "hybrid_override_pattern": ["M", "*", "-", "E"],
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 8,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_conv_bias": True,
        "moe_shared_expert_intermediate_size": 32,
        "hidden_act": "relu2",
        "mlp_hidden_act": "relu2",
    },
    "plamo2": {
        "hidden_size_per_head": 16,
        "full_attention_idx": [1],
        "mamba_d_state": 8,
        "mamba_num_heads": 4,
        "mamba_step": 2,
        "mamba_chunk_size": 16,
    },
    "recurrent_gemma": {
        "conv1d_width": 4,
        "logits_soft_cap": 30.0,
        "attention_window_size": WINDOW,
        "block_types": ["recurrent", "attention"],
        "num_key_value_heads": 1,
    },
    "qwen3_next": {**_LINEAR, "full_attention_interval": 2, "mlp_only_layers": [0]},
    "qwen3_5": _text("qwen3_5_text", **_LINEAR, full_attention_interval=2),
    "qwen3_5_moe": _text("qwen3_5_moe_text", **_LINEAR, full_attention_interval=2),
    "olmo_hybrid": {
        **_LINEAR,
        "linear_allow_neg_eigval": True,
        "layer_types": ["linear_attention", _FA],
    },
    "kimi_linear": {
        "model_max_length": 4096,
        "linear_attn_config": {
            "kda_layers": [1],
            "full_attn_layers": [2],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "num_experts_per_token": 2,
    },
    "bailing_moe_linear": {"layer_group_size": 2, "group_norm_size": 1},
    "bailing_hybrid": {"layer_group_size": 2, "group_norm_size": 1},
    "bailing_moe_v3": {"layer_group_size": 2, "moe_shared_expert_intermediate_size": 32},
    "kimi_k3": _text(
        "kimi_linear",
        linear_attn_config={
            "kda_layers": [1],
            "full_attn_layers": [2],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        num_experts_per_token=2,
        hidden_act="situ",
        activation_situ_beta=1.0,
        activation_situ_linear_beta=1.0,
    ),
    # Wrappers of one-kind text models.
    "qwen2_vl": _text("qwen2"),
    "qwen3_vl": _text("qwen3"),
    "qwen3_vl_moe": _text("qwen3_moe", tie_word_embeddings=False),
    # Sparse, compressed or shared attention; MoE.
    "minimax_m3_vl": _text(
        "minimax_m3",
        dense_intermediate_size=128,
        intermediate_size=32,
        mlp_layer_types=["dense", "sparse"],
        rotary_dim=8,
        sparse_attention_config={
            "sparse_num_index_heads": 2,
            "sparse_index_dim": 16,
            "sparse_block_size": WINDOW,
            "sparse_topk_blocks": 2,
            "sparse_local_block": 1,
            "sparse_attention_freq": [0, 1],
        },
    ),
    "gemma4_text": {
        "num_hidden_layers": 4,
        "layer_types": [_SW, _FA, _SW, _FA],
        "num_kv_shared_layers": 2,
        "sliding_window": WINDOW,
        "global_head_dim": 32,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": TRAINED_VOCAB_SIZE,
        "attention_k_eq_v": True,
        "enable_moe_block": True,
        "top_k_experts": 2,
    },
    "gemma3n": _text(
        "gemma3n_text",
        num_hidden_layers=4,
        layer_types=[_SW, _FA, _SW, _FA],
        num_kv_shared_layers=2,
        sliding_window=WINDOW,
        vocab_size_per_layer_input=TRAINED_VOCAB_SIZE,
        rope_local_base_freq=10000.0,
        final_logit_softcapping=30.0,
        activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
        hidden_size_per_layer_input=16,
        altup_num_inputs=4,
        altup_coef_clip=120.0,
        altup_correct_scale=True,
        altup_active_idx=0,
        laurel_rank=8,
    ),
    "nemotron-nas": {
        "num_hidden_layers": 3,
        "block_configs": [  # attention + MLP; no attention; linear attention, no MLP
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
        ],
    },
    "phi3small": {
        "dense_attention_every_n_layers": 2,
        "ff_intermediate_size": 128,
        "gegelu_limit": 20.0,
        "blocksparse_block_size": 32,  # the smallest mlx-lm takes
        "blocksparse_num_local_blocks": 1,
        "blocksparse_vert_stride": 2,
    },
    "deepseek_v41": {  # V4: sliding layer, compressed + indexed layer, compressed layer
        "num_hidden_layers": 3,
        "sliding_window": WINDOW,
        "compress_ratios": [0, 4, 16],
        "kv_source_layer_ids": [1, 2],
        "index_source_layer_ids": [1],
        "o_groups": 2,
        "o_lora_rank": 16,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 4,
        "hc_mult": 2,
        "hc_sinkhorn_iters": 3,
        "rms_norm_eps": 1e-6,
    },
}

# mlx-lm text architectures left out, and why.
EXCLUDED: dict[str, str] = {
    "bitnet": "its BitLinear layers run a Metal kernel only (no CPU back-end)",
    "muse_spark": "its fused qk-norm + RoPE is a Metal kernel only (no CPU back-end)",
    "olmo": "imports the ai2-olmo package, not installed",
    "prism_hadamard_qwen35": "loads only 2-bit Hadamard-rotated packs of qwen3_5 (same layers)",
}

# Built and listed, but mlx-lm itself is unsafe to run with them here: the zoo tier leaves them out.
UNSTABLE: dict[str, str] = {
    "phi3small": "mlx-lm's blocksparse attention corrupts the heap on the CPU: the process aborts "
    "(at once for a prompt shorter than its 32-token block, later otherwise)",
}

# The default std (1/sqrt(hidden) = 0.125) makes these repeat one token; these give varied text.
_INIT_STD: dict[str, float] = {
    "afmoe": 0.05,
    "gear": 0.02,
    "gemma": 0.25,
    "phi3small": 0.25,
    "qwen3": 0.25,
    "qwen3_moe": 0.5,
    "qwen3_vl": 0.25,
    "iquestloopcoder": 0.25,
    "mamba": 0.25,
    "mamba2": 0.25,
    "muse_glimmer": 0.25,
    "plamo2": 0.02,
    "plamo3": 0.02,
    "rwkv7": 0.5,
}


# Public API


def archs() -> tuple[str, ...]:
    """The zoo's architectures, sorted."""
    return tuple(sorted(ZOO))


def zoo_config(arch: str) -> dict[str, Any]:
    """A fresh config.json dict for one zoo architecture (``model_type`` = ``arch``).

    Raises:
        ConfigError: ``arch`` is not in the zoo.
    """
    if arch not in ZOO:
        raise ConfigError(f"unknown zoo arch {arch!r}; valid: {', '.join(archs())}")
    return copy.deepcopy({**_BASE, "model_type": arch, **ZOO[arch]})


def make_zoo_model(out_dir: Path, arch: str, *, seed: int = 0, overwrite: bool = False) -> Path:
    """Write a loadable mlx-lm model directory for a zoo arch: tokenizer, seeded float32 weights.

    Args:
        out_dir: The directory to create.
        arch: A key of ``ZOO``.
        seed: The same seed gives the same weights, hence the same greedy output.
        overwrite: Replace ``out_dir`` if it exists.

    Returns:
        ``out_dir``.
    """
    from mlxd.models.maker import write_model  # MLX is imported only to build

    return write_model(
        out_dir,
        zoo_config(arch),
        seed=seed,
        init_std=_INIT_STD.get(arch),
        overwrite=overwrite,
        progress=lambda line: None,
    )


def cache_kinds(model: Any) -> list[str]:
    """Class names of the caches mlx-lm makes for ``model``, nested ones in parentheses."""
    from mlx_lm.models.cache import make_prompt_cache

    return [_kind(c) for c in make_prompt_cache(model)]


def _kind(cache: Any) -> str:  # CacheList and the like nest theirs
    inner = getattr(cache, "caches", None)
    name = type(cache).__name__
    return f"{name}({','.join(_kind(c) for c in inner)})" if inner else name


def collapse(kinds: list[str]) -> str:
    """``["A", "A", "B"]`` -> ``"A x2, B"``."""
    out: list[str] = []
    for kind in kinds:
        if out and out[-1].split(" x")[0] == kind:
            head, _, n = out[-1].partition(" x")
            out[-1] = f"{head} x{int(n or 1) + 1}"
        else:
            out.append(kind)
    return ", ".join(out)
