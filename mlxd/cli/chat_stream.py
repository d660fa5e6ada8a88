"""One streamed chat completion from the daemon, as text pieces: what `mlxd run` prints.

Standard library HTTP only (``http.client`` undoes the chunked encoding), so `mlxd run` needs
nothing beyond the base install. Closing the stream early (Ctrl-C) closes the connection, and
the gateway cancels the request when its client goes away.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import click

CONNECT_TIMEOUT_S = 10.0
# A first request may wait for the model to load and compile: the read timeout is generous.
READ_TIMEOUT_S = 900.0


def stream_chat(url: str, body: dict[str, Any], api_key: str | None = None) -> Iterator[str]:
    """POST ``body`` (``stream`` set) to ``/v1/chat/completions``; yield each content piece.

    Raises:
        click.ClickException: the daemon cannot be reached, refused the request, or sent an
            error event mid-stream; one line that says why.
    """
    conn = _connect(url)
    try:
        response = _post(conn, url, {**body, "stream": True}, api_key)
        for raw in response:
            if not raw.startswith(b"data:"):
                continue  # blank lines between events, ": keepalive" comments
            data = raw[5:].strip()
            if data == b"[DONE]":
                return
            piece = _content(json.loads(data))
            if piece:
                yield piece
    except (OSError, http.client.HTTPException) as exc:
        raise click.ClickException(f"lost the connection to mlxd at {url}: {exc}") from None
    finally:
        conn.close()


# Internal helpers


def _connect(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise click.ClickException(f"bad --url {url!r}: use http://HOST:PORT")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=CONNECT_TIMEOUT_S)


def _post(
    conn: http.client.HTTPConnection, url: str, body: dict[str, Any], api_key: str | None
) -> http.client.HTTPResponse:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
        if conn.sock is not None:
            conn.sock.settimeout(READ_TIMEOUT_S)
        response = conn.getresponse()
    except OSError as exc:
        raise click.ClickException(f"cannot reach mlxd at {url}: {exc}") from None
    if response.status != 200:
        raise click.ClickException(_error(response.read(), response.status))
    return response


def _content(event: Any) -> str:
    if not isinstance(event, dict):
        return ""
    if "error" in event:
        raise click.ClickException(_message(event["error"]))
    choices = event.get("choices") or [{}]
    return str((choices[0].get("delta") or {}).get("content") or "")


def _error(raw: bytes, status: int) -> str:
    try:
        return f"{_message(json.loads(raw)['error'])} (HTTP {status})"
    except (ValueError, KeyError, TypeError):
        return f"mlxd answered HTTP {status}"


def _message(error: Any) -> str:
    text = error.get("message") if isinstance(error, dict) else error
    return " ".join(str(text).split())  # one line, whatever the message
