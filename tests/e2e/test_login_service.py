"""`mlxd service install|uninstall` write the platform's file (checked by its own tool where this
machine has it), run the manager's commands (a stand-in systemctl on PATH records them: CI must
never enable a real unit), refuse bad `mlxd start` options, and `mlxd status` reports it."""

from __future__ import annotations

import json
import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
PLUTIL = shutil.which("plutil")  # macOS only


def mlxd(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLXD_", "XDG_CONFIG"))}
    env.update(HOME=str(tmp_path / "home"), MLXD_HOME=str(tmp_path / "data"))
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args], capture_output=True, text=True, timeout=60, env=env
    )


def unit_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / ".config" / "systemd" / "user" / "mlxd.service"


def test_systemd_unit_runs_start_with_the_options_given(tmp_path: Path) -> None:
    r = mlxd(
        tmp_path,
        "service",
        "install",
        "--platform",
        "systemd",
        "--no-enable",
        "--model",
        "my model=/models/a b",
        "--port",
        "8123",
    )
    assert r.returncode == 0, r.stderr
    text = unit_path(tmp_path).read_text()
    log = tmp_path / "data" / "service.log"
    assert (
        f'ExecStart={sys.executable} -m mlxd start --model "my model=/models/a b" --port 8123\n'
    ) in text
    assert f"StandardOutput=append:{log}\n" in text and f"StandardError=append:{log}\n" in text
    assert f"Environment=MLXD_HOME={tmp_path / 'data'}\n" in text
    assert "WantedBy=default.target" in text and "Restart=on-failure" in text
    assert f"log: {log}" in r.stdout


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed here")
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert mlxd(tmp_path, "service", "install", "--no-enable", "--port", "8123").returncode == 0
    check = subprocess.run(
        [str(SYSTEMD_ANALYZE), "verify", str(unit_path(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "mlxd.service" not in check.stderr, check.stderr


def test_launchd_agent_is_a_valid_plist(tmp_path: Path) -> None:
    r = mlxd(
        tmp_path, "service", "install", "--platform", "launchd", "--no-enable", "--port", "8123"
    )
    assert r.returncode == 0, r.stderr
    path = tmp_path / "home" / "Library" / "LaunchAgents" / "local.mlxd.plist"
    if PLUTIL is not None:  # the platform's own checker, where it exists (macOS)
        assert subprocess.run([PLUTIL, "-lint", str(path)]).returncode == 0
    agent = plistlib.loads(path.read_bytes())
    assert agent["ProgramArguments"] == [sys.executable, "-m", "mlxd", "start", "--port", "8123"]
    assert agent["Label"] == "local.mlxd" and agent["RunAtLoad"] is True
    assert (
        agent["StandardOutPath"]
        == agent["StandardErrorPath"]
        == str(tmp_path / "data" / "service.log")
    )


def test_install_and_uninstall_tell_systemd(tmp_path: Path) -> None:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    assert mlxd(tmp_path, "service", "install", "--platform", "systemd", path=path).returncode == 0
    r = mlxd(tmp_path, "service", "uninstall", "--platform", "systemd", path=path)
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines() == [
        "--user daemon-reload",
        "--user enable mlxd.service",
        "--user disable --now mlxd.service",
    ]
    assert not unit_path(tmp_path).exists()
    again = mlxd(tmp_path, "service", "uninstall", "--platform", "systemd", path=path)
    assert again.returncode == 1 and "no mlxd login service is installed" in again.stderr


@pytest.mark.parametrize(
    "args", [("--bogus",), ("--detach",), ("--port", "many"), ("--platform", "windows")]
)
def test_bad_options_are_one_line_and_write_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = mlxd(tmp_path, "service", "install", "--no-enable", *args)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not unit_path(tmp_path).exists()


def test_status_says_whether_it_is_installed(tmp_path: Path) -> None:
    url = ["--url", "http://127.0.0.1:9"]  # nothing listens there
    before = mlxd(tmp_path, "status", *url)
    assert before.returncode == 1 and "login service: not installed" in before.stdout
    assert mlxd(tmp_path, "service", "install", "--no-enable").returncode == 0
    after = json.loads(mlxd(tmp_path, "status", "--json", *url).stdout)
    assert after["login_service"]["installed"] is True
    assert after["login_service"]["path"] == str(unit_path(tmp_path))
