"""Fixtures shared by every test tier.

Import mlx inside fixtures, never at module level: the unit tier must not load it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxd.worker import blas

# The in-process model tests compute on the CPU backend too: load the optimized BLAS, as the
# workers do, before any test imports MLX (MLXD_BLAS=off leaves MLX's reference BLAS).
blas.preload(os.environ)


@pytest.fixture(autouse=True)
def _attention_shapes_thawed() -> Iterator[None]:
    """A warm-up in one test freezes the process's attention shapes (``attention_shapes.freeze``);
    the next test starts with none built, as a fresh worker does."""
    yield
    shapes = sys.modules.get("mlxd.worker.kv.attention_shapes")
    if shapes is not None:
        shapes._frozen = False
        shapes._built.clear()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen3 float32 model directory (seed 0), made once per test session.

    Loadable with ``mlx_lm.load``; ids: ``<|endoftext|>`` (pad) = 0, ``<|im_end|>`` (eos) = 2.
    """
    from mlxd.models.maker import make_model

    out_dir = tmp_path_factory.mktemp("models") / "tiny-qwen3"
    return make_model(out_dir, arch="qwen3", size="tiny", progress=lambda line: None)
