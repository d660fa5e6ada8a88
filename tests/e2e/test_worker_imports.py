"""A worker's process: it imports no deep-learning framework it finds installed
(worker/frameworks.py): with a ``torch`` package on the path, which transformers imports when it
is installed, a real daemon's worker loads its model and answers without importing it; and it
keeps the kernels MLX compiles in mlxd's data folder (``worker_command.PTX_CACHE``)."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from mlxd.daemon.worker_command import PTX_CACHE
from mlxd.worker import frameworks
from tests.e2e.conftest import start_daemon, started_env, stop_daemon

pytestmark = [pytest.mark.e2e]


def installed_torch(root: Path, marker: Path) -> Path:
    """A ``torch`` under ``root`` as pip installs it (package and metadata), which leaves
    ``marker`` when something imports it."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('imported\\n')\n__version__ = '2.9.0'\n"
    )
    info = root / "torch-2.9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n")
    return root


def test_a_worker_serves_without_importing_an_installed_torch(
    tiny_model: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "torch-imported"
    site = installed_torch(tmp_path / "site", marker)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    home = tmp_path / "home"
    env = {"PYTHONPATH": path, "MLXD_HOME": str(home)}
    daemon = start_daemon(tiny_model, "--max-context", "512", env=env)
    try:
        worker = started_env(daemon.worker_pid())
        assert worker[PTX_CACHE] == str(home / "kernels")  # kept past a reboot, unlike /tmp
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="x", max_retries=0)
        reply = client.completions.create(model=daemon.model, prompt="hello", max_tokens=4)
        assert reply.choices[0].text is not None and reply.usage.completion_tokens > 0
    finally:
        stop_daemon(daemon)
    assert not marker.exists(), "the worker imported torch"


def test_hide_leaves_a_framework_already_imported() -> None:
    imported = object()
    table: dict[str, object] = {"torch": imported}
    assert "torch" not in frameworks.hide(table)
    assert table["torch"] is imported and table["sklearn"] is None
