"""The CPU backend's compute dtype (mlxd.worker.cpu_backend) on a real float16 tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.model]

# Fixed prompts of the greedy comparison (float32 vs the file's float16), 16 tokens each.
PROMPTS = [
    "hello world",
    "The quick brown fox",
    "1 2 3 4 5",
    "Once upon a time there",
    "def main():",
    "Paris is the capital of",
    "a b c d e f g",
    "Why is the sky blue?",
]


@pytest.fixture(scope="module")
def half_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.maker import make_model

    out = tmp_path_factory.mktemp("models") / "tiny-f16"
    return make_model(out, dtype="float16", progress=lambda line: None)


def _load(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(path))[:2]  # type: ignore[return-value]


def _dtypes(model: Any) -> set[str]:
    from mlx.utils import tree_flatten

    return {str(v.dtype).removeprefix("mlx.core.") for _, v in tree_flatten(model.parameters())}


def test_auto_computes_half_precision_in_float32_on_the_cpu(half_model: Path) -> None:
    from mlxd.worker import cpu_backend

    model, _ = _load(half_model)
    info = cpu_backend.prepare(model, "auto")
    assert _dtypes(model) == {"float32"}
    assert (info.device, info.dtype, info.file_dtype) == ("cpu", "float32", "float16")
    assert info.gemm_gflops > 0 and info.gemm_size == 256


def test_file_keeps_the_files_dtype(half_model: Path) -> None:
    from mlxd.worker import cpu_backend

    model, _ = _load(half_model)
    info = cpu_backend.prepare(model, "file")
    assert _dtypes(model) == {"float16"} and info.dtype == info.file_dtype == "float16"


def test_quantized_weights_stay_quantized(tmp_path: Path) -> None:
    from mlxd.models.maker import make_model
    from mlxd.worker import cpu_backend

    path = make_model(tmp_path / "q4", dtype="float16", quantize_bits=4, progress=lambda s: None)
    model, _ = _load(path)
    cpu_backend.prepare(model, "auto")
    assert _dtypes(model) == {"uint32", "float32"}  # packed weights; scales, biases, norms


def test_greedy_output_float32_vs_the_files_float16(half_model: Path) -> None:
    from mlx_lm import generate

    from mlxd.worker import cpu_backend

    outputs = []
    for dtype in ("file", "auto"):
        model, tokenizer = _load(half_model)
        cpu_backend.prepare(model, dtype)
        outputs.append([generate(model, tokenizer, p, max_tokens=16) for p in PROMPTS])
    agree = sum(a == b for a, b in zip(*outputs, strict=True))
    # Random weights give near-flat logits, where half and single precision may pick differently
    assert agree >= len(PROMPTS) - 2, f"{agree} of {len(PROMPTS)} greedy outputs agree"


def test_footprint_growth_matches_the_cast(half_model: Path) -> None:
    import json

    from mlxd.daemon.footprint import dtype_growth
    from mlxd.worker import cpu_backend

    model, _ = _load(half_model)
    before = cpu_backend.weights_bytes(model)
    cpu_backend.prepare(model, "auto")
    config = json.loads((half_model / "config.json").read_text())
    assert cpu_backend.weights_bytes(model) / before == dtype_growth(config, "auto") == 2.0
