"""Workers on the CPU backend: the optimized BLAS or its fallback, and the compute dtype, as a
real `mlxd start` shows them (log, `/admin/models/M/status`, `mlxd worker status`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxd.worker import blas
from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def no_blas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    """Two workers on one float16 model ("auto" and "keep": dtype = "file"), with the BLAS
    lookup pointed at an empty directory; yields the daemon and its log."""
    from mlxd.models.maker import make_model

    tmp = tmp_path_factory.mktemp("cpu-backend")
    model = make_model(tmp / "tiny-f16", dtype="float16", progress=lambda line: None)
    (tmp / "empty").mkdir()
    config = tmp / "mlxd.toml"
    config.write_text(f'[models.keep]\npath = "{model}"\ndtype = "file"\n')  # auto: --model
    log = tmp / "daemon.log"
    with log.open("wb") as stderr:
        d = start_daemon(
            model,
            "--config",
            str(config),
            name="auto",
            stderr=stderr,
            env={"MLXD_BLAS": str(tmp / "empty")},
        )
    yield d, log
    if d.proc.poll() is None:
        stop_daemon(d)


def status(d: Daemon, model: str) -> dict[str, Any]:
    r = d.admin_get(f"/admin/models/{model}/status")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_without_an_optimized_blas_each_worker_warns_once_and_serves(
    no_blas: tuple[Daemon, Path],
) -> None:
    d, log = no_blas
    body = {"model": "auto", "prompt": "hello world", "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    warnings = [line for line in log.read_text().splitlines() if "no optimized BLAS" in line]
    assert len(warnings) == 2, warnings  # one line per worker
    assert status(d, "auto")["compute"]["blas"] == ""


def test_half_precision_weights_are_computed_in_float32_by_default(
    no_blas: tuple[Daemon, Path],
) -> None:
    compute = status(no_blas[0], "auto")["compute"]
    assert (compute["device"], compute["dtype"], compute["file_dtype"]) == (
        "cpu",
        "float32",
        "float16",
    )
    assert compute["gemm_gflops"] > 0


def test_dtype_file_keeps_the_files_half_precision(no_blas: tuple[Daemon, Path]) -> None:
    compute = status(no_blas[0], "keep")["compute"]
    assert compute["dtype"] == compute["file_dtype"] == "float16"


def test_cli_worker_status_shows_the_compute_row(no_blas: tuple[Daemon, Path]) -> None:
    env = {**os.environ, "MLXD_URL": no_blas[0].base_url}
    out = subprocess.run(
        [sys.executable, "-m", "mlxd", "worker", "status", "auto"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "cpu, float32 (file float16: weights cast, float memory x2), BLAS none" in out.stdout


@pytest.mark.skipif(blas.find(os.environ) is None, reason="no optimized BLAS on this machine")
def test_a_worker_computes_with_the_systems_blas(shared_daemon: Daemon) -> None:
    compute = status(shared_daemon, shared_daemon.model)["compute"]
    assert compute["blas"] and blas.is_optimized(Path(compute["blas"]))
