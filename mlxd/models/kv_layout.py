"""A model's KV layout: the bytes of K/V one token takes, the one sizing rule of the daemon's
footprint (read from ``config.json``, before any worker runs) and the worker's paged pool (from
the shapes its caches take). Pure Python: the daemon never imports MLX.

A layer that keeps K/V keeps, per token, ``heads`` rows of keys (``key_dim`` values) and of
values (``value_dim``). MLA (DeepSeek V2/V3, Kimi K2...) keeps one row: the latent
(``kv_lora_rank``) as its keys and the rotary part (``qk_rope_head_dim``) as its values, as
mlx-lm's cache does. Recurrent and linear-attention layers of a hybrid (Qwen3-Next, LFM2,
Nemotron-H, Jamba) keep a fixed state and no per-token K/V, and layers that reuse another's K/V
(``num_kv_shared_layers``) none: neither counts. Sliding-window layers count per token like
full ones: the worker pays their slabs from the same budget, one beside each block, and the
prefix cache keeps the slabs that fell behind (``worker/window_slabs.py``).

With ``--kv-bits`` a row is stored as ``mx.quantize`` lays it out (``worker/kv_format.py``):
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


def from_config(model_config: dict[str, Any], dtype_bytes: int | None = None) -> KVLayout:
    """The layout of a ``config.json``; ``dtype_bytes``: the compute dtype's size (default:
    the file's ``torch_dtype``, else half precision)."""
    text = model_config.get("text_config") or model_config
    if dtype_bytes is None:
        dtype_bytes = DTYPE_BYTES.get(str(text.get("torch_dtype") or "float16"), 2)
    layers = _kv_layers(text)
    if text.get("kv_lora_rank"):  # MLA: one latent row and its rotary part
        rope_dim = int(text.get("qk_rope_head_dim") or 0)
        return KVLayout(layers, 1, int(text["kv_lora_rank"]), rope_dim, dtype_bytes)
    attention_heads = int(text.get("num_attention_heads") or 0)
    heads = int(text.get("num_key_value_heads") or attention_heads)
    hidden = int(text.get("hidden_size") or 0)
    head_dim = int(text.get("head_dim") or hidden // max(1, attention_heads))
    value_dim = int(text.get("v_head_dim") or head_dim)
    return KVLayout(layers, heads, head_dim, value_dim, dtype_bytes)


def _kv_layers(text: dict[str, Any]) -> int:
    """The layers that keep per-token K/V: attention layers, less those sharing another's."""
    layers = int(text.get("num_hidden_layers") or 0)
    attention = _attention_layers(text, layers)
    return max(0, attention - int(text.get("num_kv_shared_layers") or 0))


def _attention_layers(text: dict[str, Any], layers: int) -> int:
    """How many of ``layers`` attend (a hybrid's others keep a fixed state), from whichever
    way the config spells its layer kinds."""
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if _is_attention(str(t)))
    pattern = text.get("hybrid_override_pattern")  # Nemotron-H: "*" attends, "M" is Mamba
    if isinstance(pattern, str) and pattern:
        return pattern.count("*")
    if isinstance(text.get("full_attn_idxs"), list):  # LFM2
        return len(text["full_attn_idxs"])
    if interval := int(text.get("full_attention_interval") or 0):  # Qwen3-Next
        return layers // interval
    if period := int(text.get("attn_layer_period") or 0):  # Jamba
        offset = int(text.get("attn_layer_offset") or 0)
        return sum(1 for i in range(layers) if i % period == offset)
    return layers


def _is_attention(kind: str) -> bool:
    # "full_attention", "sliding_attention", "attention"; not "linear_attention", "conv", "mamba"
    return kind.endswith("attention") and not kind.startswith("linear")
