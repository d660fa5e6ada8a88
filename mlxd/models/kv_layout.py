"""A model's KV layout: the bytes of K/V one token takes, the one sizing rule of the daemon's
footprint (read from ``config.json``, before any worker runs) and the worker's paged pool (from
the shapes its caches take). Pure Python: the daemon never imports MLX.

A layer that keeps K/V keeps, per token, ``heads`` rows of keys (``key_dim`` values) and of
values (``value_dim``); a model's layers may take more than one shape (Gemma 4's full layers
have wider heads than its window layers). MLA (DeepSeek V3, Kimi K2, GLM-4.7-Flash...) keeps
one row: the latent (``kv_lora_rank``) as its keys and the rotary part (``qk_rope_head_dim``) as
its values, as mlx-lm's cache does (its DeepSeek V2 and MiniCPM3 still keep every head's K/V).
Recurrent and linear-attention layers of a hybrid (Qwen3-Next, LFM2, Nemotron-H, Jamba, Kimi
Linear) keep a fixed state and no per-token K/V, and layers that reuse another's K/V
(``num_kv_shared_layers``) none: neither counts. Sliding-window layers count per token like
full ones: the worker pays their slabs from the same budget, one beside each block, and the
prefix cache keeps the slabs that fell behind (``worker/kv/window_slabs.py``).

With ``--kv-bits`` a row is stored as ``mx.quantize`` lays it out (``worker/kv/formats.py``):
``dim * bits / 32`` packed ``uint32`` words, and a scale and a bias in the compute dtype per
``group_size`` values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The K/V one token keeps: ``layers`` layers of ``heads`` key and value rows, in a
    compute dtype of ``dtype_bytes`` bytes."""

    layers: int
    heads: int
    key_dim: int
    value_dim: int
    dtype_bytes: int = 2

    def token_bytes(self, bits: int | None = None, group_size: int = 64) -> int:
        """Bytes of K and V one token takes over every layer, float (``bits`` None) or
        quantized to ``bits`` in groups of ``group_size``."""
        keys = row_bytes(self.key_dim, self.dtype_bytes, bits, group_size)
        values = row_bytes(self.value_dim, self.dtype_bytes, bits, group_size)
        return self.layers * self.heads * (keys + values)

    def block_bytes(self, block_size: int, bits: int | None = None, group_size: int = 64) -> int:
        """Bytes of one pool block of ``block_size`` tokens."""
        return block_size * self.token_bytes(bits, group_size)


def row_bytes(dim: int, dtype_bytes: int, bits: int | None = None, group_size: int = 64) -> int:
    """Bytes one head's ``dim`` values take as stored: floats, or packed ``bits``-bit words
    plus a scale and a bias (each in the compute dtype) per ``group_size`` values."""
    if bits is None:
        return dim * dtype_bytes
    return dim * bits // 8 + 2 * (dim // group_size) * dtype_bytes


def from_config(model_config: dict[str, Any], dtype_bytes: int | None = None) -> list[KVLayout]:
    """The layouts of a ``config.json``, one per shape its K/V layers take (Gemma 4's full
    layers have wider heads than its window layers); ``dtype_bytes``: the compute dtype's size
    (default: the file's ``torch_dtype``, else half precision)."""
    text = model_config.get("text_config") or model_config
    if dtype_bytes is None:
        dtype_bytes = DTYPE_BYTES.get(str(text.get("torch_dtype") or "float16"), 2)
    shapes: dict[tuple[int, int, int], int] = {}
    for kind in _kv_kinds(text):
        shape = _shape(text, kind)
        shapes[shape] = shapes.get(shape, 0) + 1
    return [KVLayout(n, *shape, dtype_bytes) for shape, n in shapes.items()]


def config_token_bytes(
    model_config: dict[str, Any],
    dtype_bytes: int | None = None,
    bits: int | None = None,
    group_size: int = 64,
) -> int:
    """Bytes of K/V one token takes over every layer of a ``config.json`` (``from_config``)."""
    layouts = from_config(model_config, dtype_bytes)
    return sum(layout.token_bytes(bits, group_size) for layout in layouts)


def _shape(text: dict[str, Any], kind: str) -> tuple[int, int, int]:
    """(heads, key dim, value dim) of one layer of ``kind`` ("full" or "sliding")."""
    if text.get("kv_lora_rank"):
        return _mla_shape(text)
    attention_heads = int(text.get("num_attention_heads") or text.get("n_head") or 0)
    heads = int(text.get("num_key_value_heads") or attention_heads)
    if text.get("multi_query"):  # GPT-BigCode
        heads = 1
    hidden = int(text.get("hidden_size") or text.get("n_embd") or 0)
    head_dim = int(text.get("head_dim") or hidden // max(1, attention_heads))
    if kind == "full" and text.get("global_head_dim"):  # Gemma 4's full layers
        head_dim = int(text["global_head_dim"])
        if text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
            heads = int(text["num_global_key_value_heads"])
    return heads, head_dim, int(text.get("v_head_dim") or head_dim)


def _mla_shape(text: dict[str, Any]) -> tuple[int, int, int]:
    rope_dim = int(text.get("qk_rope_head_dim") or 0)
    if text.get("model_type") in _EXPANDED_MLA:  # K/V of every head, as plain attention keeps
        heads = int(text.get("num_attention_heads") or 0)
        key_dim = int(text.get("qk_nope_head_dim") or 0) + rope_dim
        return heads, key_dim, int(text.get("v_head_dim") or key_dim)
    return 1, int(text["kv_lora_rank"]), rope_dim  # one latent row and its rotary part


def has_state(model_config: dict[str, Any]) -> bool:
    """Whether a ``config.json``'s model has layers that keep a fixed state (a hybrid's
    recurrent or linear-attention layers)."""
    return "state" in _layer_kinds(model_config.get("text_config") or model_config)


def has_window(model_config: dict[str, Any]) -> bool:
    """Whether a ``config.json``'s model has sliding-window attention layers."""
    return "sliding" in _layer_kinds(model_config.get("text_config") or model_config)


# MLA models whose mlx-lm attention caches the decompressed K/V of every head
_EXPANDED_MLA = ("deepseek_v2", "minicpm3", "youtu_llm")


def _kv_kinds(text: dict[str, Any]) -> list[str]:
    """Per layer that keeps its own K/V: "full" or "sliding" (a hybrid's recurrent layers keep
    a fixed state, and the last ``num_kv_shared_layers`` reuse earlier layers' K/V)."""
    kinds = _layer_kinds(text)
    shared = int(text.get("num_kv_shared_layers") or 0)
    kept = kinds[: len(kinds) - shared] if shared else kinds
    return [k for k in kept if k != "state"]


def _layer_kinds(text: dict[str, Any]) -> list[str]:
    """Each layer's kind ("full", "sliding" or "state"), from whichever way the config spells
    them."""
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0)
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return [_kind(str(t)) for t in types]
    pattern = text.get("hybrid_override_pattern")  # Nemotron-H: "*" attends, "M" is Mamba
    if isinstance(pattern, str | list) and pattern:
        return ["full" if p == "*" else "state" for p in pattern]
    if text.get("loop_window_size"):  # IQuest Loop: a second pass over the layers, windowed
        return ["full"] * layers + ["sliding"] * layers
    return [_kind_at(text, i, layers) for i in range(layers)]


def _kind_at(text: dict[str, Any], i: int, layers: int) -> str:
    """Layer ``i``'s kind where the config names attention layers by index or period."""
    linear = text.get("linear_attn_config")
    if isinstance(linear, dict) and "kda_layers" in linear:  # Kimi Linear: 1-based
        return "state" if i + 1 in linear["kda_layers"] else "full"
    for key in ("full_attn_idxs", "full_attention_idx"):  # LFM2, PLaMo 2
        if isinstance(text.get(key), list):
            return "full" if i in text[key] else "state"
    if interval := int(text.get("full_attention_interval") or 0):  # Qwen3-Next
        return "full" if (i + 1) % interval == 0 else "state"
    if group := int(text.get("layer_group_size") or 0):  # Bailing linear: last of each group
        return "full" if (i + 1) % group == 0 or i >= layers // group * group else "state"
    if period := int(text.get("attn_layer_period") or 0):  # Jamba
        return "full" if i % period == int(text.get("attn_layer_offset") or 0) else "state"
    return _window_kind(text.get("sliding_window_pattern"), i)


def _window_kind(pattern: Any, i: int) -> str:
    """Layer ``i``'s kind by ``sliding_window_pattern``: a period whose last layer is full
    (Gemma 3, Cohere 2, PLaMo 3), or a string of "L" (windowed) and "G" (EXAONE 4)."""
    if isinstance(pattern, str) and pattern:
        return "sliding" if pattern[i % len(pattern)] == "L" else "full"
    if isinstance(pattern, int) and pattern > 1:
        return "full" if (i + 1) % pattern == 0 else "sliding"
    return "full"


def _kind(layer_type: str) -> str:
    # "full_attention", "attention", "sliding_attention"; not "linear_attention", "conv", "mamba"
    if not layer_type.endswith("attention") or layer_type.startswith("linear"):
        return "state"
    return "sliding" if layer_type.startswith("sliding") else "full"
