"""How much memory a model's worker will take, known before it starts (MLX is imported only to
tell its backend, for a half-precision model under ``--dtype auto``).

Weights: the sizes of the model's ``*.safetensors`` files (what MLX maps into memory), doubled
for a half-precision model the worker computes in float32 (``dtype_growth``). KV: the
model's own ``kv_cache_gb`` or the daemon's (``--kv-cache-gb``), else what ``max_num_seqs`` full
contexts need, at most ``DEFAULT_KV_BYTES``, its bytes per token from ``config.json`` by the
worker pool's own rule (``models/kv_layout.py``: the layers that keep K/V, in the compute dtype,
packed to ``--kv-bits`` with their scales and biases in a paged pool); under ``--max-memory``
the worker's KV pool is then given exactly that size. Headroom: activations, the MLX buffer
cache, Python and the tokenizer, measured as a fixed runtime cost plus a share; a
vision-language model's weights are every ``*.safetensors`` file (its vision tower and projector
too) and its headroom holds the vision tower's bounded feature cache and the encoder's peak
activations (``vision_layout.encoder_peak_bytes``); ``vision_weights_bytes`` says how much of
the weights is the tower and its projector (from the files' headers).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.config import ModelSpec, ServeConfig, kv_bytes_wanted
from mlxd.models import kv_layout, sources
from mlxd.models.vision_layout import encoder_peak_bytes, vision_headroom, vision_weight_bytes

log = logging.getLogger(__name__)

DEFAULT_KV_BYTES = 2 * 2**30
DEFAULT_CONTEXT = 4096
RUNTIME_BYTES = 256 * 2**20  # a tiny model's worker idles at ~130 MB RSS (Python, MLX, tokenizer)
HEADROOM_SHARE = 0.10  # of weights + KV: activations and the MLX buffer cache
UNCAPPED_CACHE_FLOOR = 2**30  # the least buffer cache a worker keeps without --max-memory
_DTYPE_BYTES = kv_layout.DTYPE_BYTES


@dataclass(frozen=True)
class Footprint:
    """A worker's memory, as reserved against ``--max-memory``."""

    weights_bytes: int
    kv_bytes: int
    headroom_bytes: int
    # A vision-language model's: its tower's and projector's share of ``weights_bytes``, and
    # the encoder's peak activations, counted in ``headroom_bytes``.
    vision_weights_bytes: int = 0
    encoder_peak_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.headroom_bytes


def device_share(size: Footprint, ranks: int) -> Footprint:
    """What one rank of a group of ``ranks`` holds of ``size`` (tensor parallel splits every
    attention and MLP projection and the K/V heads; each rank has its own runtime). Low by the
    copied embeddings and norms: a few percent of a large model, more of a small one."""
    if ranks <= 1:
        return size
    peak = size.encoder_peak_bytes  # the vision tower is not split: each rank's whole
    share = -(-(size.headroom_bytes - RUNTIME_BYTES - peak) // ranks)
    return Footprint(
        -(-size.weights_bytes // ranks),
        -(-size.kv_bytes // ranks),
        RUNTIME_BYTES + share + peak,
        -(-size.vision_weights_bytes // ranks),
        size.encoder_peak_bytes,
    )


def buffer_cache_bytes(size: Footprint, capped: bool = True) -> int:
    """The cap on a worker's MLX buffer cache: the headroom's share for activations and cached
    buffers (the headroom less the fixed runtime), at least 64 MiB under ``--max-memory``
    (``capped``) and ``UNCAPPED_CACHE_FLOOR`` without it; the worker never raises MLX's own
    limit with it (32 MiB on the CPU backend). MLX's own is the device's memory limit on a GPU
    (95 % of it; the recommended working set on Metal): a worker left to it kept every freed
    buffer until it held the whole card (docs/PERFORMANCE.md, run S1)."""
    return max(64 * 2**20 if capped else UNCAPPED_CACHE_FLOOR, size.headroom_bytes - RUNTIME_BYTES)


def footprint(spec: ModelSpec, config: ServeConfig) -> Footprint:
    """``spec``'s footprint under ``config`` (its scheduler, context and KV settings), with
    the draft model's weights and per-row caches when ``--draft-model`` gives one."""
    dtype = spec.dtype or config.dtype
    weights, model_config, growth = _weights(spec.path, dtype)
    kv = _kv(spec, config, model_config, growth)
    if (draft := config.scheduler.draft_model) is not None:
        draft_weights, draft_config, draft_growth = _weights(draft, dtype)
        weights += draft_weights
        per_token = kv_bytes_per_token(draft_config, draft_growth)  # its own float caches
        kv += min(
            per_token * config.scheduler.max_num_seqs * _context(config, model_config),
            DEFAULT_KV_BYTES,
        )
    vision_weights, peak = _vision(spec.path, dtype, model_config, growth)
    headroom = RUNTIME_BYTES + int(HEADROOM_SHARE * (weights + kv)) + vision_headroom(model_config)
    return Footprint(weights, kv, headroom + peak, vision_weights, peak)


def _vision(path: str, dtype: str, model_config: dict[str, Any], growth: float) -> tuple[int, int]:
    """A vision-language model's tower weights as computed and its encoder's peak; (0, 0) for
    a text model."""
    if not isinstance(model_config.get("vision_config"), dict):
        return 0, 0
    directory = model_dir(path)
    if sources.is_convertible(path):
        directory = sources.converted_dir(path, dtype)
    text = model_config.get("text_config") or {}
    named = [c.get("torch_dtype") for c in (model_config["vision_config"], text, model_config)]
    file_dtype = str(next((d for d in named if d), "float16"))
    value_bytes = int(_DTYPE_BYTES.get(file_dtype, 2) * growth)
    weights = int(vision_weight_bytes(directory) * growth)
    return weights, encoder_peak_bytes(model_config, max(1, value_bytes))


def _weights(path: str, dtype: str) -> tuple[int, dict[str, Any], float]:
    """A model's weight bytes as computed (in ``dtype``), its config and that growth."""
    directory = _directory(path, dtype)
    files = [] if directory is None else list(directory.glob("*.safetensors"))
    weights = sum(f.stat().st_size for f in files)
    if directory is None:
        log.warning("%s is not on this machine yet: its weights are not counted", path)
    model_config = _read_config(directory)
    growth = dtype_growth(model_config, dtype)
    return int(weights * growth), model_config, growth


def _context(config: ServeConfig, model_config: dict[str, Any]) -> int:
    return config.max_context or int(model_config.get("max_position_embeddings") or DEFAULT_CONTEXT)


def _kv(spec: ModelSpec, config: ServeConfig, model_config: dict[str, Any], growth: float) -> int:
    kv_gb = kv_cache_gb(spec, config)
    if kv_gb is not None:
        return int(kv_gb * 2**30)
    cache = config.cache
    bits = cache.kv_bits if cache.paged else None  # only the paged pool quantizes
    per_token = kv_bytes_per_token(model_config, growth, bits, cache.kv_group_size)
    wanted = kv_bytes_wanted(
        per_token, config.scheduler.max_num_seqs, _context(config, model_config), config.cache.paged
    )
    return min(wanted, DEFAULT_KV_BYTES)


def kv_cache_gb(spec: ModelSpec, config: ServeConfig) -> float | None:
    """``spec``'s KV budget in GiB: its own ``kv_cache_gb``, else the daemon's (config file or
    ``--kv-cache-gb``); None: sized from ``max_num_seqs`` full contexts."""
    return config.cache.kv_cache_gb if spec.kv_cache_gb is None else spec.kv_cache_gb


def model_dir(path: str) -> Path | None:
    """The local directory of a model: the path itself, or a repo id's cached snapshot."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.is_absolute() or path.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or no hub library): unknown size
        return None


def kv_bytes_per_token(
    model_config: dict[str, Any], growth: float = 1.0, bits: int | None = None, group_size: int = 64
) -> int:
    """Keys and values of one token over every layer that keeps them, from a ``config.json``:
    in the compute dtype (the file's grown by ``growth``), quantized to ``bits`` if given."""
    text = model_config.get("text_config") or model_config
    file_bytes = _DTYPE_BYTES.get(str(text.get("torch_dtype") or "float16"), 2)
    return kv_layout.config_token_bytes(model_config, int(file_bytes * growth), bits, group_size)


def dtype_growth(model_config: dict[str, Any], dtype: str) -> float:
    """How much the worker's ``--dtype`` grows a model's float weights (and its K/V) over the
    file's: 2 for half precision computed in float32 (``auto`` on MLX's CPU backend, or
    ``float32``), 0.5 for float32 cast to half, else 1. Quantized models count as 1: their
    packed weights stay packed (only scales, biases and norms are cast)."""
    text = model_config.get("text_config") or model_config
    file = str(text.get("torch_dtype") or "")
    if "quantization" in model_config or file not in _DTYPE_BYTES or dtype == "file":
        return 1.0
    target = "float32" if dtype == "auto" and file != "float32" and _cpu_backend() else dtype
    return _DTYPE_BYTES[target] / _DTYPE_BYTES[file] if target in _DTYPE_BYTES else 1.0


def _cpu_backend() -> bool:
    import mlx.core as mx  # only for a half-precision model under --dtype auto

    return bool(mx.default_device() == mx.cpu)


def config_of(path: str, dtype: str) -> dict[str, Any]:
    """The ``config.json`` of the model at ``path`` ({} where none is found locally)."""
    return _read_config(_directory(path, dtype))


def _directory(path: str, dtype: str) -> Path | None:
    """Where the model at ``path`` is, as a worker loads it: a GGUF's or an ``ollama:``
    model's directory is what `mlxd start` converted it to."""
    if sources.is_convertible(path):
        return sources.converted_dir(path, dtype)
    return model_dir(path)


def _read_config(directory: Path | None) -> dict[str, Any]:
    if directory is None:
        return {}
    try:
        obj = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}
