"""``--dtype`` and the TOML ``dtype`` key: validated in the config, passed on to each worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.cli.config_file import read_config_file
from mlxd.cli.supervisor import Supervisor
from mlxd.config import ModelSpec, ServeConfig, WorkerConfig
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
    args = [supervisor._worker_args(supervisor._worker(name)) for name in ("a", "b")]
    assert [a[a.index("--dtype") + 1] for a in args] == ["file", "float32"]
