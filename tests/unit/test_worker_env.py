"""A worker's environment: its GPUs, where MLX keeps the kernels it compiles (mlxd's data
folder), and MLX's CUDA graphs off for a hybrid (layers with recurrent state) or a model with
sliding-window layers, read from the model's ``config.json`` before the worker starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlxd.config import ModelSpec, ServeConfig
from mlxd.daemon.supervisor import Supervisor
from mlxd.daemon.worker_command import CUDA_GRAPHS, PTX_CACHE, worker_env

LINEAR, FULL, SLIDING = "linear_attention", "full_attention", "sliding_attention"
HYBRIDS = {
    "qwen3.5 (a VLM's text_config)": {"text_config": {"layer_types": [LINEAR] * 3 + [FULL]}},
    "qwen3-next": {"num_hidden_layers": 8, "full_attention_interval": 4},
    "lfm2": {"layer_types": ["conv", FULL, "conv", FULL]},
    "nemotron-h": {"hybrid_override_pattern": "M*M*"},
}
WINDOWED = {
    "layer_types": {"layer_types": [SLIDING, FULL]},
    "gemma 3's period": {"num_hidden_layers": 6, "sliding_window_pattern": 6},
    "exaone 4's letters": {"num_hidden_layers": 4, "sliding_window_pattern": "LLLG"},
}
OTHERS = {
    "dense": {"num_hidden_layers": 4},
    "a window on every layer's config, no window layers": {
        "num_hidden_layers": 4,
        "sliding_window": 4096,
    },
    "a period of one": {"num_hidden_layers": 4, "sliding_window_pattern": 1},
    "no config.json": None,
}


def worker_for(tmp_path: Path, config: dict[str, Any] | None) -> tuple[Any, ServeConfig]:
    """A worker slot for a model whose directory holds ``config`` (None: no config.json)."""
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    serve = ServeConfig(models=(ModelSpec(name="m", path=str(model)),))
    return Supervisor(serve, tmp_path)._worker("m"), serve


def env_of(tmp_path: Path, config: dict[str, Any] | None, environ: dict[str, str]) -> dict:
    """``worker_env`` for that model, with the kernel folder a user's own (left out)."""
    worker, serve = worker_for(tmp_path, config)
    return worker_env(worker, serve, {PTX_CACHE: "/theirs"} | environ)


def test_compiled_kernels_are_kept_in_mlxds_data_folder(tmp_path: Path) -> None:
    worker, serve = worker_for(tmp_path, OTHERS["dense"])
    home = tmp_path / "home"
    assert worker_env(worker, serve, {"MLXD_HOME": str(home)}) == {PTX_CACHE: f"{home}/kernels"}
    assert worker_env(worker, serve, {PTX_CACHE: "/theirs"}) == {}  # a user's own stands


@pytest.mark.parametrize("config", HYBRIDS.values(), ids=HYBRIDS)
def test_a_hybrids_worker_starts_without_cuda_graphs(tmp_path: Path, config: dict) -> None:
    assert env_of(tmp_path, config, {}) == {CUDA_GRAPHS: "0"}


@pytest.mark.parametrize("config", WINDOWED.values(), ids=WINDOWED)
def test_a_windowed_models_worker_starts_without_cuda_graphs(tmp_path: Path, config: dict) -> None:
    assert env_of(tmp_path, config, {}) == {CUDA_GRAPHS: "0"}


@pytest.mark.parametrize("config", OTHERS.values(), ids=OTHERS)
def test_other_workers_keep_mlxs_default(tmp_path: Path, config: dict | None) -> None:
    assert env_of(tmp_path, config, {}) == {}


@pytest.mark.parametrize("value", ["1", "0"])
def test_the_users_own_setting_stands(tmp_path: Path, value: str) -> None:
    """Set in the daemon's environment, it reaches every worker as it is (``spawn`` adds to
    that environment), so the worker's own entry would only override it."""
    assert env_of(tmp_path, HYBRIDS["qwen3-next"], {CUDA_GRAPHS: value}) == {}


def test_a_placed_hybrid_gets_its_gpus_too(tmp_path: Path) -> None:
    worker, serve = worker_for(tmp_path, HYBRIDS["lfm2"])
    worker.gpus = "1"
    env = worker_env(worker, serve, {PTX_CACHE: "/theirs"})
    assert env == {"CUDA_VISIBLE_DEVICES": "1", CUDA_GRAPHS: "0"}
