"""Model sources that mlx-lm cannot load itself: GGUF files and ``ollama:`` names.

Each becomes a converted mlx-lm directory in ``$MLXD_HOME/cache/gguf``. Importing this module
imports no MLX (the CLI's memory budget asks it where a conversion is). ``mlxd start`` converts
them up front (with progress on the terminal, before any worker's start timeout runs); a worker
resolves the same spec to the same cached directory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from mlxd.config import ModelSpec, data_dir
from mlxd.errors import ConfigError
from mlxd.models import ollama

if TYPE_CHECKING:
    from mlxd.models.gguf import Progress

log = logging.getLogger("mlxd.models")

CACHE_SUBDIR = Path("cache") / "gguf"
# Dequantizing on the CPU backend: float32 takes up to ~8x a 4-bit file; it is done only when
# that fits in this share of the RAM, else the weights stay quantized (slower, but they load).
FLOAT32_GROWTH = 8
MAX_FLOAT32_SHARE = 0.5


def is_convertible(spec: str) -> bool:
    """Whether ``spec`` (a ``--model`` path) is a GGUF file or an Ollama name."""
    return spec.lower().endswith(".gguf") or ollama.is_ollama(spec)


def resolve(spec: str, dtype: str = "auto", progress: Progress | None = None) -> str:
    """What mlx-lm should load for ``spec``: the converted directory, or ``spec`` unchanged.

    Args:
        spec: A ``--model`` path: a GGUF file, ``ollama:NAME[:TAG]``, or anything mlx-lm loads.
        dtype: The worker's ``--dtype``: ``float32``, or ``auto`` on MLX's CPU backend when
            float32 fits in memory, dequantizes GGUF quantized weights (BLAS-fast on the CPU);
            others keep them quantized.
        progress: As for ``gguf.ensure_converted``.
    """
    if not is_convertible(spec):
        return spec
    from mlxd.models import gguf

    path, name = _source(spec)
    cache = data_dir() / CACHE_SUBDIR
    converted = gguf.ensure_converted(
        path, cache, dequantize=_dequantize(dtype, path), name=name, progress=progress
    )
    return str(converted)


def converted_dir(spec: str, dtype: str) -> Path | None:
    """The conversion ``resolve`` would load for ``spec``, if it is made already (else None)."""
    from mlxd.models import gguf

    try:
        path, name = _source(spec)
        target = gguf.cache_path(
            path, data_dir() / CACHE_SUBDIR, dequantize=_dequantize(dtype, path), name=name
        )
    except ConfigError:
        return None
    return target if (target / "config.json").is_file() else None


def prepare(specs: Iterable[ModelSpec], dtype: str, progress: Progress) -> None:
    """Convert every GGUF / Ollama model of ``specs`` now (``mlxd start``, before workers)."""
    for spec in specs:
        if spec.endpoint is None and is_convertible(spec.path):
            resolve(spec.path, spec.dtype or dtype, progress)


def _source(spec: str) -> tuple[Path, str | None]:
    """The GGUF file of ``spec`` and a name for its conversion (None: the file's stem)."""
    if ollama.is_ollama(spec):
        return ollama.resolve(spec), ollama.cache_name(spec)
    return Path(spec), None


def _dequantize(dtype: str, path: Path) -> bool:
    if dtype != "auto":
        return dtype == "float32"
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        return False
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if path.stat().st_size * FLOAT32_GROWTH > ram * MAX_FLOAT32_SHARE:
        log.warning("%s: float32 would not fit in memory; its weights stay quantized", path.name)
        return False
    return True
