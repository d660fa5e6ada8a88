"""The CLI's client of the daemon's ``/admin/*`` HTTP endpoints (`mlxd worker ...`, `mlxd ps`).

A daemon on this host is reached through its admin Unix socket (``admin_socket``: no key, file
permissions guard it); a remote one, or one whose socket is not found, over TCP with the admin
key. Standard library HTTP only, so the admin commands need nothing beyond the base install.
Every failure becomes one ``click.ClickException`` line: click prints it and exits 1.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mlxd.config import data_dir
from mlxd.daemon import admin_socket

_F = TypeVar("_F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:8000"
# The daemon's one JSON view (models, workers' figures, recent requests): `mlxd ps`, `mlxd status`
# and the status page at / all read it.
OVERVIEW_PATH = "/admin/overview"
TIMEOUT_S = 30.0

admin_options = [
    click.option(
        "--url",
        default=DEFAULT_URL,
        show_default=True,
        envvar="MLXD_URL",
        help="The running daemon (env MLXD_URL).",
    ),
    click.option(
        "--admin-key",
        default=None,
        metavar="KEY",
        envvar="MLXD_ADMIN_KEY",
        help="Sent as 'Authorization: Bearer KEY' (env MLXD_ADMIN_KEY).",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer."),
]


def with_admin_options(fn: _F) -> _F:
    """Add --url, --admin-key and --json to a command."""
    for option in reversed(admin_options):
        fn = option(fn)
    return fn


class AdminClient:
    """Blocking JSON requests to one daemon's admin endpoints.

    Args:
        url: the daemon's base URL, e.g. ``http://127.0.0.1:8000``.
        admin_key: sent as a bearer token over TCP when given (never over the Unix socket).
    """

    def __init__(self, url: str, admin_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self.socket = admin_socket.find(data_dir(), self.url)  # None: remote, or not found

    def get(self, path: str) -> dict[str, Any]:
        return self._request("GET", path, None)

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._request("POST", path, {} if body is None else body)

    @staticmethod
    def model_path(model: str, what: str) -> str:
        """``/admin/models/{model}/{what}``, with the model name escaped."""
        return f"/admin/models/{urllib.parse.quote(model, safe='/')}/{what}"

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        if self.socket is not None:
            try:
                return self._over_socket(self.socket, method, path, data, headers)
            except (ConnectionRefusedError, FileNotFoundError):
                self.socket = None  # a stale pointer (a killed daemon): try TCP
            except OSError as exc:
                raise click.ClickException(f"cannot reach mlxd at {self.socket}: {exc}") from None
        if self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 - our URL
                return _json(resp.read())
        except urllib.error.HTTPError as exc:
            raise click.ClickException(_error_line(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise click.ClickException(f"cannot reach mlxd at {self.url}: {reason}") from None

    def _over_socket(
        self, socket_path: Path, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> dict[str, Any]:
        conn = admin_socket.UnixHTTPConnection(socket_path, TIMEOUT_S)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            raise click.ClickException(_error_text(body, resp.reason, resp.status))
        return _json(body)


def format_bytes(num: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


def _json(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        raise click.ClickException("the daemon sent a body that is not JSON") from None
    if not isinstance(obj, dict):
        raise click.ClickException("the daemon sent an unexpected JSON answer")
    return obj


def _error_line(exc: urllib.error.HTTPError) -> str:
    return _error_text(exc.read(), str(exc.reason), exc.code)


def _error_text(body: bytes, reason: str, status: int) -> str:
    try:
        error = json.loads(body)["error"]
        message = " ".join(str(error["message"]).split())  # one line, whatever the message
    except (ValueError, KeyError, TypeError):
        message = reason
    return f"{message} (HTTP {status})"
