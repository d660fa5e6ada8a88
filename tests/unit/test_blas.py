"""Finding an optimized BLAS for the CPU backend (mlxd.worker.blas): no MLX import, no loading."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxd.worker import blas


def _library(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_off_searches_nowhere() -> None:
    assert blas.search_path({"MLXD_BLAS": "off"}) == []
    assert blas.find({"MLXD_BLAS": "off"}) is None


def test_an_empty_directory_has_none(tmp_path: Path) -> None:
    assert blas.find({"MLXD_BLAS": str(tmp_path)}) is None


def test_openblas_is_found_in_the_directories_given(tmp_path: Path) -> None:
    empty, lib_dir = tmp_path / "empty", tmp_path / "lib"
    empty.mkdir()
    lib = _library(lib_dir / "libopenblas.so.0")
    assert blas.find({"MLXD_BLAS": os.pathsep.join([str(empty), str(lib_dir)])}) == lib


def test_a_library_file_may_be_named(tmp_path: Path) -> None:
    lib = _library(tmp_path / "openblas-pthread" / "libblas.so.3")
    assert blas.find({"MLXD_BLAS": str(lib)}) == lib


def test_generic_libblas_counts_only_when_it_resolves_to_an_optimized_one(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "libblas.so.3").symlink_to(_library(tmp_path / "blas" / "libblas.so.3.11"))
    (tmp_path / "b").mkdir()
    target = _library(tmp_path / "openblas-pthread" / "libblas.so.3")
    (tmp_path / "b" / "libblas.so.3").symlink_to(target)
    assert blas.find({"MLXD_BLAS": str(tmp_path / "a")}) is None  # the reference BLAS
    assert blas.find({"MLXD_BLAS": str(tmp_path / "b")}) == tmp_path / "b" / "libblas.so.3"


def test_default_search_is_the_system_library_directories() -> None:
    dirs = blas.search_path({})
    assert Path("/usr/lib") in dirs and Path("/usr/local/lib") in dirs


def test_preload_is_linux_only(tmp_path: Path) -> None:
    _library(tmp_path / "libopenblas.so.0")
    assert blas.preload({"MLXD_BLAS": str(tmp_path)}, platform="darwin") is None


def test_preload_of_a_library_that_cannot_load_gives_none(tmp_path: Path) -> None:
    _library(tmp_path / "libopenblas.so.0")  # empty: dlopen fails
    assert blas.preload({"MLXD_BLAS": str(tmp_path)}, platform="linux") is None


def test_preload_after_mlx_is_imported_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _library(tmp_path / "libopenblas.so.0")
    monkeypatch.setitem(sys.modules, "mlx.core", object())  # too late: MLX bound its BLAS
    assert blas.preload({"MLXD_BLAS": str(tmp_path)}, platform="linux") is None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs procfs")
def test_loaded_ignores_numpys_suffixed_openblas() -> None:
    pytest.importorskip("numpy")  # maps libscipy_openblas64_, which MLX never calls
    assert "scipy_openblas" not in (blas.loaded() or "")


def test_the_cli_imports_no_mlx_before_the_worker_preloads() -> None:
    # `mlxd worker serve` preloads after the CLI's imports: one of them importing mlx.core would
    # leave every worker on the reference BLAS.
    code = "import sys, mlxd.cli.main; print('mlx.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
