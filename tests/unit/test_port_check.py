"""`mlxd start` checks its port before it spawns workers: free as uvicorn sees it, no stricter."""

from __future__ import annotations

import socket

import pytest

from mlxd.daemon.server import check_port_free
from mlxd.errors import ConfigError


def _time_wait_port() -> int:
    """A port with no listener whose last connection (closed by the server side) is in TIME_WAIT."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the side that closes first holds TIME_WAIT: here, the server's port
    client.recv(1)
    client.close()
    server.close()
    return int(port)


def test_a_port_in_time_wait_is_free() -> None:
    check_port_free("127.0.0.1", _time_wait_port())


def test_a_port_with_a_listener_is_refused() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="cannot listen"):
            check_port_free("127.0.0.1", busy.getsockname()[1])
