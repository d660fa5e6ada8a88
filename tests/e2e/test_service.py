"""`mlxd start --detach`, `status`, `load`, `unload`, `ps`, `stop` in a private data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import child_pids, free_port

pytestmark = [pytest.mark.e2e]


def mlxd(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    env["MLXD_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_detach_status_load_unload_ps_stop(tiny_model: Path, tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    config = tmp_path / "mlxd.toml"
    config.write_text(
        f'[models.a]\npath = "{tiny_model}"\n'
        f'[models.b]\npath = "{tiny_model}"\npreload = false\n'
        f'[models.bad]\npath = "/nonexistent/model"\npreload = false\n'
    )
    r = mlxd(
        home,
        "start",
        "--detach",
        "--config",
        str(config),
        "--port",
        str(port),
        "--max-context",
        "512",
    )
    assert r.returncode == 0, r.stderr
    url = f"http://127.0.0.1:{port}"
    assert f"mlxd is running at {url}" in r.stdout and "mlxd: " in r.stderr  # progress shown
    pid = int((home / "mlxd.pid").read_text())
    assert alive(pid) and (home / "mlxd.log").stat().st_size > 0
    try:
        again = mlxd(home, "start", "--detach", "--port", str(free_port()))
        assert again.returncode != 0 and "already running" in again.stderr, again.stderr
        assert len(again.stderr.strip().splitlines()) == 1

        status = mlxd(home, "status")
        assert status.returncode == 0, status.stderr
        assert f"running at {url} (pid {pid}" in status.stdout
        data = json.loads(mlxd(home, "status", "--json").stdout)
        assert data["running"] and data["detached"] and data["pid"] == pid
        states = {m["name"]: m["state"] for m in data["models"]}
        assert states == {"a": "ready", "b": "unloaded", "bad": "unloaded"}

        load = mlxd(home, "load", "b")
        assert load.returncode == 0 and load.stdout.startswith("b: ready"), load.stderr
        ps = mlxd(home, "ps", "--url", url)
        assert [line.split()[:2] for line in ps.stdout.splitlines()[1:]] == [
            ["a", "running"],
            ["b", "running"],
            ["bad", "unloaded"],
        ]
        unload = mlxd(home, "unload", "b", "--json")
        assert unload.returncode == 0 and json.loads(unload.stdout)["state"] == "unloaded"
        missing = mlxd(home, "load", "nope")
        assert missing.returncode == 1 and "does not exist" in missing.stderr

        # A worker that cannot load is reported failed with its reason, not retried; requests
        # for it get a 503 that says why.
        bad = mlxd(home, "load", "bad")
        assert bad.returncode == 1 and "bad did not load: failed" in bad.stderr, bad.stderr
        [info] = [
            m
            for m in json.loads(mlxd(home, "status", "--json").stdout)["models"]
            if m["name"] == "bad"
        ]
        assert info["state"] == "failed" and "refused to load: " in info["last_error"], info
        r = httpx.post(f"{url}/v1/completions", json={"model": "bad", "prompt": "x"}, timeout=30)
        assert r.status_code == 503 and "failed" in r.json()["error"]["message"]
    finally:
        workers = child_pids(pid)
        stop = mlxd(home, "stop")
    assert stop.returncode == 0 and f"mlxd (pid {pid}) stopped" in stop.stdout, stop.stderr
    assert not alive(pid) and not [w for w in workers if alive(w)]
    assert not (home / "mlxd.pid").exists()
    gone = mlxd(home, "status")
    assert gone.returncode == 1 and "not running" in gone.stderr


def test_stop_force_kills_the_daemon_and_its_workers(tiny_model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = mlxd(home, "start", "--detach", "--model", f"m={tiny_model}", "--port", str(free_port()))
    assert r.returncode == 0, r.stderr
    pid = int((home / "mlxd.pid").read_text())
    workers = child_pids(pid)
    assert workers
    stop = mlxd(home, "stop", "--force", "--json")
    assert stop.returncode == 0 and json.loads(stop.stdout)["forced"], stop.stderr
    deadline = time.monotonic() + 10
    while [w for w in workers if alive(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid) and not [w for w in workers if alive(w)]
    assert not (home / "mlxd.pid").exists()
