"""The daemon's admin Unix socket: how the CLI on the same host reaches ``/admin/*`` without a key.

Over TCP the admin API needs the admin key, always: any client a same-host proxy forwards, and
any local process of any user, looks like loopback. The socket is ``admin.sock`` in the daemon's
0700 runtime directory (mode 0600 itself), so only the daemon's user can connect: file
permissions are the guard, as for Docker's socket. The socket path is random (``mkdtemp``), so the
daemon leaves a pointer, ``run/admin-PORT`` in the data dir, that the CLI reads to find it.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import urllib.parse
from pathlib import Path

SOCKET_NAME = "admin.sock"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class AdminSocket:
    """The admin socket of one daemon: bound in ``runtime_dir``, published in ``data_dir``.

    Args:
        runtime_dir: the daemon's 0700 runtime directory (worker sockets live there too).
        data_dir: where the pointer for the CLI goes (``run/admin-PORT``).
        port: the daemon's TCP port, which names the pointer.
    """

    def __init__(self, runtime_dir: Path, data_dir: Path, port: int) -> None:
        self.path = runtime_dir / SOCKET_NAME
        self.pointer = pointer_path(data_dir, port)

    def bind(self) -> socket.socket:
        """Listen on the socket (mode 0600) and publish where it is."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        self.path.chmod(0o600)
        sock.listen(128)
        self.pointer.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.pointer.with_suffix(".tmp")
        tmp.write_text(f"{self.path}\n")
        tmp.replace(self.pointer)
        return sock

    def close(self) -> None:
        """Remove the pointer if it is still ours (a later daemon on the port may own it)."""
        with contextlib.suppress(OSError):
            if self.pointer.read_text().strip() == str(self.path):
                self.pointer.unlink()


def pointer_path(data_dir: Path, port: int) -> Path:
    return data_dir / "run" / f"admin-{port}"


def find(data_dir: Path, url: str) -> Path | None:
    """The admin socket of the daemon at ``url`` when it runs on this host, else ``None``."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS or parts.port is None:
        return None
    try:
        path = Path(pointer_path(data_dir, parts.port).read_text().strip())
    except OSError:
        return None
    return path if path.is_socket() else None


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket: the CLI's requests to ``find``'s socket."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock
