"""GGUF files as mlx-lm model directories: converted once, cached, then loaded like any other.

``mx.load`` reads GGUF itself and keeps Q4_0, Q4_1 and Q8_0 tensors as MLX affine-quantized
triplets (``weight``/``scales``/``biases``, group size 32), so those stay quantized; it converts
a few other quant types (Q4_K, Q6_K, ...) to float16, and refuses the rest, which
``gguf_reader.py`` then reads the same way. Those float16 tensors stay float16 (the worker's
``--dtype`` decides what they compute in). With ``dequantize`` every weight is stored as float32
instead: on MLX's CPU backend a float32 matmul goes through BLAS and a quantized one does not
(SmolLM2-135M Q4_1, a 37-token prompt's prefill: 0.7 s vs 15.6 s). llama.cpp permutes the
rows of ``attn_q``/``attn_k`` for its RoPE layout; they are put back in Hugging Face order here
(rows are output features, so a quantized weight's scales and biases move with them), so the
directory is a standard mlx-lm model (``llama``, ``qwen2`` or ``qwen3``).
Each conversion is written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx_lm.utils import make_shards

from mlxd.errors import ConfigError
from mlxd.models.gguf_tokenizer import write_tokenizer

log = logging.getLogger("mlxd.models")

Progress = Callable[[str], None]
CONVERTER_VERSION = 1  # bump when the output changes: cached conversions are keyed on it
GROUP_SIZE = 32  # every GGUF block type MLX keeps quantized has 32 weights per block
DEQUANTIZED_DTYPE = mx.float32  # what `dequantize` stores: the CPU backend's BLAS dtype
_LAYER_PARTS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
ARCHS = ("llama", "qwen2", "qwen3")  # GGUF general.architecture = the mlx-lm model_type
_PERMUTED = ("llama",)  # the archs whose q/k rows convert_hf_to_gguf.py permutes
_TOP_PARTS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


# Public API


def is_gguf(path: str) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix)."""
    return path.lower().endswith(".gguf")


def ensure_converted(
    gguf_path: Path,
    cache_dir: Path,
    *,
    dequantize: bool = False,
    name: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """The mlx-lm directory converted from ``gguf_path``; converted on the first call.

    Conversions are cached in ``cache_dir``, keyed on the file's real path, size, modification
    time, ``dequantize`` and ``CONVERTER_VERSION``; concurrent callers serialise on a lock.

    Args:
        gguf_path: The GGUF file.
        cache_dir: Where converted models live (``$MLXD_HOME/cache/gguf``).
        dequantize: Store every weight as float32 (see the module docstring).
        name: Names the cache entry (default: the file's stem).
        progress: Receives one line per long step; default: the ``mlxd.models`` logger.

    Returns:
        The model directory.
    """
    source = Path(gguf_path).expanduser().resolve()
    target = cache_path(source, cache_dir, dequantize=dequantize, name=name)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                convert(source, tmp, dequantize=dequantize, progress=progress)
                os.rename(tmp, target)
                (progress or log.info)(f"cached as {target}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def cache_path(
    gguf_path: Path, cache_dir: Path, *, dequantize: bool = False, name: str | None = None
) -> Path:
    """Where ``ensure_converted`` keeps (or will keep) the conversion of ``gguf_path``."""
    source = Path(gguf_path).expanduser().resolve()
    if not source.is_file():
        raise ConfigError(f"GGUF file {str(gguf_path)!r} does not exist")
    label = (name or source.stem).replace("/", "-").replace(":", "-")
    suffix = "-f32" if dequantize else ""
    return Path(cache_dir) / f"{label}-{_cache_key(source, dequantize)}{suffix}"


def convert(
    gguf_path: Path, out_dir: Path, *, dequantize: bool = False, progress: Progress | None = None
) -> None:
    """Write an mlx-lm model directory (config, safetensors, tokenizer) for a GGUF file.

    Args:
        gguf_path: The GGUF file (an architecture of ``ARCHS``).
        out_dir: A directory to create; it must not exist.
        dequantize, progress: As for ``ensure_converted``.
    """
    report = progress or log.info
    started = time.monotonic()
    how = "dequantized to float32" if dequantize else "quantized as in the file"
    report(f"converting {gguf_path.name} ({gguf_path.stat().st_size / 2**20:.0f} MiB, {how}) ...")
    try:
        loaded = mx.load(str(gguf_path), return_metadata=True)
    except RuntimeError:  # a quant type MLX's loader cannot convert (Q5_0, IQ*, ...)
        from mlxd.models import gguf_reader

        report("reading it with the gguf package (MLX's loader cannot take all its types) ...")
        loaded = gguf_reader.read(gguf_path)
    tensors, metadata = cast(tuple[dict[str, mx.array], dict[str, Any]], loaded)
    config = _config(metadata, tensors)
    weights = _weights(tensors, config)
    if dequantize:
        weights = _dequantized(weights)
    if quantization := _quantization(weights):
        config["quantization"] = quantization
    out_dir.mkdir(parents=True)
    config["eos_token_id"] = write_tokenizer(metadata, out_dir)
    _save(weights, out_dir, report)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    report(f"converted {gguf_path.name} in {time.monotonic() - started:.1f} s")


# Internal helpers


def _cache_key(source: Path, dequantize: bool) -> str:
    stat = source.stat()
    key = f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}\0{dequantize}\0{CONVERTER_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _config(metadata: dict[str, Any], tensors: dict[str, mx.array]) -> dict[str, Any]:
    arch = metadata.get("general.architecture")
    if arch not in ARCHS:
        raise ConfigError(f"GGUF architecture {arch!r} is not supported ({', '.join(ARCHS)})")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        return value.item() if isinstance(value, mx.array) else value

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 4096),
        "vocab_size": get("vocab_size", len(metadata["tokenizer.ggml.tokens"])),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    if "rope_freqs.weight" in tensors:  # Llama 3.1+: RoPE scaling stored as per-dim factors
        config["rope_scaling"] = _llama3_rope_scaling(
            tensors["rope_freqs.weight"],
            config["rope_theta"],
            get("rope.dimension_count", 0) or config["head_dim"],
        )
    return config


def _llama3_rope_scaling(factors: mx.array, base: float, dims: int) -> dict[str, Any] | None:
    """mlx-lm's ``llama3`` rope_scaling that gives ``factors`` (convert_hf_to_gguf.py computes
    them from it, with low/high frequency factors 1 and 4 in every released Llama 3.x)."""
    wanted = [float(x) for x in cast(list[float], factors.astype(mx.float32).tolist())]
    for original in (8192, 4096, 16384, 32768):
        scaling = {
            "rope_type": "llama3",
            "factor": max(wanted),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        }
        got = _llama3_factors(scaling, base, dims)
        if all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, wanted, strict=True)):
            return scaling
    log.warning("GGUF rope_freqs match no Llama 3 RoPE scaling: ignored (long contexts degrade)")
    return None


def _llama3_factors(scaling: dict[str, Any], base: float, dims: int) -> list[float]:
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, the rope_freqs it writes
    original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * math.pi * base ** (i / dims)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _weights(tensors: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    if config["model_type"] not in _PERMUTED:
        heads = {}
    weights = {}
    for name, value in tensors.items():
        if name == "rope_freqs.weight":
            continue
        parts = name.split(".")
        if name.startswith("blk.") and parts[2] in heads:
            value = _unpermute(value, heads[parts[2]])
        weights[_hf_name(parts)] = value
    return weights


def _dequantized(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    bits = _bits(weights)
    out = {}
    for name, value in weights.items():
        prefix = name.rsplit(".", 1)[0]
        if name.endswith((".scales", ".biases")) and prefix in bits:
            continue
        if prefix in bits and name.endswith(".weight"):
            scales, biases = weights[f"{prefix}.scales"], weights[f"{prefix}.biases"]
            value = mx.dequantize(value, scales, biases, group_size=GROUP_SIZE, bits=bits[prefix])
        out[name] = value.astype(DEQUANTIZED_DTYPE)
    return out


def _unpermute(rows: mx.array, num_heads: int) -> mx.array:
    # Inverse of convert_hf_to_gguf.py `permute`: per head, rows (2, d/2) were stored as (d/2, 2).
    shape = rows.shape
    split = rows.reshape(num_heads, shape[0] // num_heads // 2, 2, *shape[1:])
    return split.swapaxes(1, 2).reshape(shape)


def _hf_name(parts: list[str]) -> str:
    if parts[0] == "blk" and parts[2] in _LAYER_PARTS:
        return f"model.layers.{parts[1]}.{_LAYER_PARTS[parts[2]]}.{parts[3]}"
    if parts[0] in _TOP_PARTS:
        return f"{_TOP_PARTS[parts[0]]}.{parts[1]}"
    raise ConfigError(f"GGUF tensor {'.'.join(parts)!r} has no mlx-lm equivalent")


def _bits(weights: dict[str, mx.array]) -> dict[str, int]:
    """Each quantized layer's bit width, from its packed weight's and its scales' widths."""
    prefixes = [name[: -len(".scales")] for name in weights if name.endswith(".scales")]
    return {
        p: weights[f"{p}.weight"].shape[-1] * 32 // (weights[f"{p}.scales"].shape[-1] * GROUP_SIZE)
        for p in prefixes
    }


def _quantization(weights: dict[str, mx.array]) -> dict[str, Any] | None:
    """mlx-lm's quantization config: the most common bit width, and per-layer exceptions."""
    bits = _bits(weights)
    if not bits:
        return None
    common = max(set(bits.values()), key=list(bits.values()).count)
    config: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": common}
    for prefix, width in bits.items():
        if width != common:
            config[prefix] = {"group_size": GROUP_SIZE, "bits": width}
    return config


def _save(weights: dict[str, mx.array], out_dir: Path, report: Progress) -> None:
    shards = make_shards(weights, max_file_size_gb=2)  # a progress line per 2 GB
    index: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(out_dir / name), shard, metadata={"format": "mlx"})
        index.update(dict.fromkeys(shard, name))
        mib = sum(v.nbytes for v in shard.values()) / 2**20
        report(f"wrote shard {i}/{len(shards)} ({mib:.0f} MiB)")
    total = sum(v.nbytes for v in weights.values())
    meta = {"metadata": {"total_size": total}, "weight_map": dict(sorted(index.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(meta, indent=2))
