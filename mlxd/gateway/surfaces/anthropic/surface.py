"""The Anthropic surface's ``/v1/messages``: how a Messages body is validated (``schemas``, into
the same ``ParsedRequest`` the OpenAI surface makes), how a local answer is written (``events``:
a message body, or Anthropic's named stream events), and Anthropic's error shape:
``{"type": "error", "error": {...}}``."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import AsyncGenerator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from mlxd.errors import InvalidRequest, MlxdError, Overloaded
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, record_of
from mlxd.gateway.request import Opened, ParsedRequest
from mlxd.gateway.surfaces.anthropic.events import error_type, message_body, message_events
from mlxd.gateway.surfaces.anthropic.schemas import parse_messages
from mlxd.gateway.surfaces.base import Surface
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.protocol.messages import Finished, TokenDelta


class MessageRenderer:
    """One Messages response: its id, its event stream or body."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self.id = f"msg_{secrets.token_hex(12)}"

    def frames(self, opened: Opened, first: TokenDelta | Finished) -> AsyncGenerator[bytes, None]:
        """``message_start`` ... ``message_stop``, from ``first`` on."""
        return message_events(opened.stream, first, opened.parsed, self.id, opened.deadline)

    def body(self, opened: Opened, results: list[ChoiceResult]) -> dict[str, Any]:
        """The whole ``message``."""
        parsed = opened.parsed
        return message_body(self.id, parsed.model, results[0], opened.stream.usage, parsed.echo)


def render_error(request: Request, exc: MlxdError | HTTPException) -> Response:
    """An error in Anthropic's shape, with the request id (and Retry-After when overloaded)."""
    if isinstance(exc, HTTPException):
        status, message, code = exc.status_code, str(exc.detail), ""
    else:
        status, message, code = exc.status_code, exc.message, exc.code
    if isinstance(exc, InvalidRequest) and exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    headers = {REQUEST_ID_HEADER: record_of(request).request_id}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    error = {"type": error_type(status, code), "message": message}
    body: dict[str, Any] = {"type": "error", "error": error}
    return Response(json.dumps(body), status, headers, media_type="application/json")


MESSAGES = Surface("anthropic", "messages", parse_messages, MessageRenderer, render_error)
