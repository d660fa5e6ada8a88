"""Who can reach the daemon: loopback by default, a private runtime directory for the worker
sockets, the admin key on /admin/*, and no secret in any log line or error message."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

API_KEY = "sk-test-0123456789abcdef-api"
ADMIN_KEY = "adm-test-fedcba9876543210-admin"
SECRETS = (API_KEY, ADMIN_KEY)


@pytest.fixture(scope="module")
def guarded(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    log_path = tmp_path_factory.mktemp("access") / "daemon.log"
    with log_path.open("wb") as log:
        d = start_daemon(
            tiny_model,
            "--log-level",
            "debug",
            "--max-context",
            "256",
            env={"MLXD_API_KEY": API_KEY, "MLXD_ADMIN_KEY": ADMIN_KEY},
            stderr=log,
        )
        d.log_path = log_path  # type: ignore[attr-defined]
        yield d
        stop_daemon(d)


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_default_bind_is_loopback_only(guarded: Daemon) -> None:
    port = int(guarded.base_url.rsplit(":", 1)[1])
    assert listening_addresses(port) == ["0100007F"]  # 127.0.0.1, nothing else


def test_worker_sockets_are_private(guarded: Daemon) -> None:
    data = Path(guarded.worker_endpoint().removeprefix("ipc://"))
    rundir = data.parent
    assert {p.name for p in rundir.iterdir()} >= {
        data.name,
        data.name.replace(".sock", ".ctl.sock"),
    }
    info = rundir.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    if os.geteuid() == 0:  # as root, check for real: another user cannot even connect
        assert _connect_as_nobody(data) == "denied"


def _connect_as_nobody(path: Path) -> str:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to nobody, try the socket, report through the pipe
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            os.write(write, b"connected")
        except PermissionError:
            os.write(write, b"denied")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


def test_admin_endpoints_need_the_admin_key(guarded: Daemon) -> None:
    url = f"{guarded.base_url}/admin/status"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    r = httpx.post(f"{guarded.base_url}/admin/models/{guarded.model}/pause")
    assert r.status_code == 401


def test_no_secret_in_logs_or_error_messages(guarded: Daemon) -> None:
    url = f"{guarded.base_url}/v1/completions"
    body = {"model": guarded.model, "prompt": "hi", "max_tokens": 2}
    near_miss = API_KEY[:-1] + "X"
    answers = [
        httpx.post(url, json=body),
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {near_miss}"}),
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"}),
        httpx.post(
            url, json={**body, "max_tokens": -1}, headers={"Authorization": f"Bearer {API_KEY}"}
        ),
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {API_KEY}"}),
        httpx.get(f"{guarded.base_url}/admin/status", headers={"Authorization": near_miss}),
    ]
    assert [r.status_code for r in answers] == [401, 401, 401, 400, 200, 401]
    worker_args = Path(f"/proc/{guarded.worker_pid()}/cmdline").read_bytes().decode()
    logs = guarded.log_path.read_text()  # type: ignore[attr-defined]
    assert "mlxd.access" in logs  # the access log was on, at debug level
    for secret in SECRETS:
        assert all(secret not in r.text for r in answers)
        assert secret not in logs and secret not in worker_args
        assert near_miss not in logs
