"""``--dtype`` and the TOML ``dtype`` key: validated in the config, passed on to each worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.cli.config_file import read_config_file
from mlxd.config import ModelSpec, ServeConfig, WorkerConfig
from mlxd.daemon.footprint import dtype_growth, footprint
from mlxd.daemon.supervisor import Supervisor
from mlxd.daemon.worker_command import worker_config
from mlxd.errors import ConfigError


def test_worker_dtype_defaults_to_auto() -> None:
    assert WorkerConfig(model="m", name="m", endpoint="ipc:///tmp/w.sock").dtype == "auto"


@pytest.mark.parametrize("dtype", ["fp16", "float64", ""])
def test_unknown_dtype_is_a_config_error(dtype: str) -> None:
    with pytest.raises(ConfigError, match="dtype must be one of auto, float32"):
        WorkerConfig(model="m", name="m", endpoint="ipc:///tmp/w.sock", dtype=dtype)


def test_config_file_dtype_per_model(tmp_path: Path) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text('[models.a]\npath = "org/a"\ndtype = "file"\n[models.b]\npath = "org/b"\n')
    a, b = read_config_file(path).models
    assert a.dtype == "file" and b.dtype is None


def test_config_file_bad_dtype_names_the_model(tmp_path: Path) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text('[models.a]\npath = "org/a"\ndtype = "half"\n')
    with pytest.raises(ConfigError, match="model 'a': dtype must be one of"):
        read_config_file(path)


def test_worker_gets_its_models_dtype_else_the_daemons(tmp_path: Path) -> None:
    specs = (ModelSpec(name="a", path="org/a", dtype="file"), ModelSpec(name="b", path="org/b"))
    supervisor = Supervisor(ServeConfig(models=specs, dtype="float32"), tmp_path)
    configs = [worker_config(supervisor._worker(name), supervisor.config) for name in "ab"]
    assert [c.dtype for c in configs] == ["file", "float32"]


@pytest.mark.parametrize(
    "config, dtype, growth",
    [
        ({"torch_dtype": "float16"}, "float32", 2.0),
        ({"torch_dtype": "bfloat16"}, "file", 1.0),
        ({"torch_dtype": "float32"}, "float16", 0.5),
        ({"torch_dtype": "float32"}, "auto", 1.0),
        ({"torch_dtype": "float16", "quantization": {"bits": 4}}, "float32", 1.0),
    ],
)
def test_dtype_growth_of_the_weights(config: dict[str, object], dtype: str, growth: float) -> None:
    assert dtype_growth(config, dtype) == growth


def test_footprint_counts_float32_weights_of_a_half_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"torch_dtype": "float16"}')
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    spec = ModelSpec(name="m", path=str(tmp_path), kv_cache_gb=1.0)
    sizes = [
        footprint(spec, ServeConfig(models=(spec,), dtype=d)).weights_bytes
        for d in ("file", "float32")
    ]
    assert sizes == [1000, 2000]
