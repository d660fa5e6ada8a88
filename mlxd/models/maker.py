"""The model maker: a complete mlx-lm model directory with seeded random weights.

Random weights cost the same compute as trained ones, so a made ``qwen3-0.6b`` benchmarks like
the real checkpoint while the whole project stays offline. Each model is built in a temporary
directory next to its destination and renamed into place, so a crash never leaves half a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import MODEL_REMAPPING, quantize_model, save_config, save_model

from mlxd.errors import ConfigError
from mlxd.models.presets import alternate_layer_types, model_config
from mlxd.models.tokenizer_maker import make_tokenizer

DTYPES: dict[str, mx.Dtype] = {
    "float32": mx.float32,
    "bfloat16": mx.bfloat16,
    "float16": mx.float16,
}
QUANTIZE_BITS = (4, 8)
QUANTIZE_GROUP_SIZE = 64
# Weights are N(0, std) with std = 1/sqrt(hidden) (at least 0.02): narrow models then produce
# varied greedy text instead of echoing their input, which makes tests of batching meaningful.
MIN_INIT_STD = 0.02
DEFAULT_MODEL_NAME = "mlxd-default"
DEFAULT_MODEL_ARCH = "qwen3"
DEFAULT_MODEL_SIZE = "small"
# float32: on MLX's 2-core CPU backend it decodes ~10% faster than bfloat16 (130 vs 115 tok/s;
# prefill is slower, 300 vs 460 tok/s) and keeps batched-vs-single comparisons tight.
DEFAULT_MODEL_DTYPE = "float32"

Progress = Callable[[str], None]


# Public API


def make_model(
    out_dir: Path,
    *,
    arch: str = "qwen3",
    size: str = "tiny",
    dtype: str = "float32",
    quantize_bits: int | None = None,
    sliding_window: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a loadable mlx-lm model directory with seeded random weights.

    Args:
        out_dir: The directory to create.
        arch: A preset architecture, see ``mlxd.models.presets.ARCHS``.
        size: A preset size of that architecture, e.g. ``tiny`` or ``qwen3-0.6b``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        quantize_bits: 4 or 8 to quantize (affine, group size 64); None keeps ``dtype``.
        sliding_window: every other layer attends to only this many recent tokens (llama and
            mistral, as Gemma-style interleaved attention; mlx-lm gives those layers a
            rotating cache). None: every layer attends to the whole context.
        seed: The same seed gives the same weights, hence the same greedy output.
        overwrite: Replace ``out_dir`` if it exists, instead of raising.
        progress: Receives one line per long step; default prints to stderr.

    Returns:
        ``out_dir``.

    Raises:
        ConfigError: Unknown preset, dtype or bit width, or ``out_dir`` exists.
    """
    config = model_config(arch, size)
    _check_options(dtype, quantize_bits)
    if sliding_window is not None:
        _interleave_sliding_window(config, arch, sliding_window)
    write_model(
        out_dir,
        config,
        dtype=dtype,
        quantize_bits=quantize_bits,
        seed=seed,
        overwrite=overwrite,
        progress=progress,
    )
    (progress or print_stderr)(f"made {arch}/{size} model in {out_dir}")
    return Path(out_dir)


def write_model(
    out_dir: Path,
    config: dict[str, Any],
    *,
    dtype: str = "float32",
    quantize_bits: int | None = None,
    seed: int = 0,
    init_std: float | None = None,
    draw_codes: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a model directory for any mlx-lm ``config.json`` dict: tokenizer, seeded weights.

    Args:
        out_dir: The directory to create, atomically (built next to it, then renamed).
        config: The config; needs top-level ``vocab_size`` (the trained tokenizer's),
            ``max_position_embeddings`` and ``hidden_size`` (sets the init std) besides the
            fields of its ``model_type``. Changed in place (``torch_dtype``).
        init_std: The weights' standard deviation; None: 1/sqrt(hidden_size), at least 0.02.
        draw_codes: With ``quantize_bits``, draw random codes directly instead of quantizing
            random ``dtype`` weights: the model never needs its full-precision size in memory
            (a 32B shape in 4 bits fits an 80 GB GPU), but its weights are not the quantized
            ``dtype`` model's of the same seed (a draft model's tests need those).
        dtype, quantize_bits, seed, overwrite, progress: As for ``make_model``.

    Returns:
        ``out_dir``.
    """
    report = progress or print_stderr
    out_dir = Path(out_dir)
    with staged_dir(out_dir, overwrite) as tmp_dir:
        std = init_std or _init_std(config)
        _build(
            tmp_dir,
            config,
            dtype=dtype,
            quantize_bits=quantize_bits,
            seed=seed,
            std=std,
            report=report,
            draw_codes=draw_codes,
        )
    return out_dir


@contextlib.contextmanager
def staged_dir(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """A hidden directory beside ``out_dir`` to write a model into; it becomes ``out_dir`` (by
    rename) when the block ends without an error, and is removed either way.

    Raises:
        ConfigError: ``out_dir`` exists and ``overwrite`` is false.
    """
    if out_dir.exists() and not overwrite:
        raise ConfigError(f"{out_dir} already exists (use --force to overwrite)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = _sibling(out_dir, "tmp")
    tmp_dir.mkdir()
    try:
        yield tmp_dir
        _install(tmp_dir, out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def ensure_default_model(data_dir: Path, progress: Progress | None = None) -> Path:
    """The built-in model ``mlxd start`` serves without ``--model``; made on first call.

    Concurrent callers serialise on a file lock, so the model is made once.

    Args:
        data_dir: mlxd's data directory; the model lives in ``data_dir/models/mlxd-default``.
        progress: As for ``make_model``.

    Returns:
        The model directory.
    """
    models_dir = Path(data_dir) / "models"
    target = models_dir / DEFAULT_MODEL_NAME
    if _is_complete(target):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with open(models_dir / f".{DEFAULT_MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_complete(target):
            make_model(
                target,
                arch=DEFAULT_MODEL_ARCH,
                size=DEFAULT_MODEL_SIZE,
                dtype=DEFAULT_MODEL_DTYPE,
                overwrite=True,
                progress=progress,
            )
    return target


# Internal helpers


def _build(
    out_dir: Path,
    config: dict[str, Any],
    *,
    dtype: str,
    quantize_bits: int | None,
    seed: int,
    std: float,
    report: Progress,
    draw_codes: bool = False,
) -> None:
    report(f"training tokenizer (vocab {config['vocab_size']})")
    make_tokenizer(
        out_dir,
        vocab_size=config["vocab_size"],
        model_max_length=config["max_position_embeddings"],
    )
    config["torch_dtype"] = dtype
    model = _build_model(config)
    num_params = sum(p.size for _, p in tree_flatten(model.parameters()))
    codes = quantize_bits if draw_codes else None
    if codes is not None:  # quantized before any weight exists: codes drawn directly
        config = _quantize(model, config, codes)
    bits = f"{codes}-bit" if codes else dtype
    report(f"initialising {num_params / 1e6:.1f}M random {bits} weights (seed {seed})")
    init_weights(model, seed, DTYPES[dtype], std, codes)
    if quantize_bits is not None and codes is None:
        report(f"quantizing to {quantize_bits} bits")
        config = _quantize(model, config, quantize_bits)
    report("saving weights")
    save_model(out_dir, model, donate_model=True)
    save_config(config, out_dir / "config.json")


def _interleave_sliding_window(config: dict[str, Any], arch: str, window: int) -> None:
    if arch not in ("llama", "mistral"):
        raise ConfigError(f"--sliding-window needs --arch llama or mistral, not {arch}")
    if window < 1:
        raise ConfigError("--sliding-window must be at least 1 token")
    config["sliding_window"] = window
    alternate_layer_types(config, "sliding_attention", "full_attention")


def _build_model(config: dict[str, Any]) -> nn.Module:
    model_type = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
    arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    model: nn.Module = arch.Model(arch.ModelArgs.from_dict(config))
    return model


def _init_std(config: dict[str, Any]) -> float:
    return max(MIN_INIT_STD, float(config["hidden_size"]) ** -0.5)


def init_weights(
    model: nn.Module, seed: int, dtype: mx.Dtype, std: float, bits: int | None = None
) -> None:
    """Seeded random weights for ``model`` (norm weights 1, biases 0): one key per parameter, in
    name order, so the weights depend on the seed alone. A model quantized to ``bits`` gets
    uniform random codes whose dequantized values have mean 0 and deviation ``std``."""
    norm_weights = {
        f"{path}.weight"
        for path, module in model.named_modules()
        if isinstance(module, nn.RMSNorm | nn.LayerNorm)
    }
    params = sorted(tree_flatten(model.parameters()), key=lambda item: item[0])
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = []
    for i, (name, param) in enumerate(params):
        if name in norm_weights:
            value = mx.ones(param.shape, dtype=dtype)
        elif name.endswith(".bias"):
            value = mx.zeros(param.shape, dtype=dtype)
        elif bits and param.dtype == mx.uint32:  # packed codes
            value = _random_words(param.shape, keys[i])
        elif bits and name.endswith((".scales", ".biases")):
            value = _code_affine(name, param.shape, std, bits, dtype)
        else:
            value = (std * mx.random.normal(param.shape, key=keys[i])).astype(dtype)
        mx.eval(value)  # one tensor at a time keeps peak memory near the model's size
        weights.append((name, value))
    model.update(tree_unflatten(weights))


def _random_words(shape: list[int], key: mx.array) -> mx.array:
    """Uniform random uint32 words (two 16-bit halves: randint's bounds are 32-bit signed)."""
    hi, lo = (mx.random.randint(0, 1 << 16, shape, mx.uint32, key=k) for k in mx.random.split(key))
    return (hi << 16) | lo


def _code_affine(name: str, shape: list[int], std: float, bits: int, dtype: mx.Dtype) -> mx.array:
    """A group's scale or bias: codes uniform on [0, 2**bits) dequantize to mean 0, ``std``."""
    levels = 2**bits
    scale = std / ((levels * levels - 1) / 12) ** 0.5
    value = scale if name.endswith(".scales") else -scale * (levels - 1) / 2
    return mx.full(shape, value, dtype=dtype)


def _quantize(model: nn.Module, config: dict[str, Any], bits: int) -> dict[str, Any]:
    # quantize_model prints its bits-per-weight line; keep stdout clean for the caller.
    with contextlib.redirect_stdout(io.StringIO()):
        _, config = quantize_model(model, config, group_size=QUANTIZE_GROUP_SIZE, bits=bits)
    return config


def _install(tmp_dir: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.rename(tmp_dir, out_dir)
        return
    # Swap by rename so a reader sees either the old model or the new one, never a mix.
    old_dir = _sibling(out_dir, "old")
    os.rename(out_dir, old_dir)
    os.rename(tmp_dir, out_dir)
    shutil.rmtree(old_dir, ignore_errors=True)


def _sibling(out_dir: Path, suffix: str) -> Path:
    # Same filesystem as out_dir, so the final rename is atomic; hidden, and unique per call.
    return out_dir.parent / f".{out_dir.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}"


def _check_options(dtype: str, quantize_bits: int | None) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if quantize_bits is not None and quantize_bits not in QUANTIZE_BITS:
        raise ConfigError(f"quantize bits must be 4 or 8, got {quantize_bits}")


def _is_complete(model_dir: Path) -> bool:
    # Models appear by rename only, so config.json present means the directory is whole.
    return (model_dir / "config.json").is_file()


def print_stderr(line: str) -> None:
    """The default progress report: a line on stderr."""
    print(line, file=sys.stderr, flush=True)
