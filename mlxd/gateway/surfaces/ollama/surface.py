"""The Ollama surface's ``/api/chat`` and ``/api/generate``: how a body is validated
(``schemas``, into the ``ParsedRequest`` every backend serves), how a local answer is written
(``stream``: NDJSON lines; ``body``: one object) and Ollama's error shape, ``{"error": "..."}``."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from mlxd.errors import MlxdError, Overloaded
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, record_of
from mlxd.gateway.request import Opened, ParsedRequest
from mlxd.gateway.surfaces.base import Surface
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.ollama import schemas
from mlxd.gateway.surfaces.ollama.body import ChatShape, GenerateShape, Shape, last
from mlxd.gateway.surfaces.ollama.names import display
from mlxd.gateway.surfaces.ollama.stream import MEDIA_TYPE, ndjson_lines
from mlxd.gateway.surfaces.ollama.timing import durations
from mlxd.protocol.messages import Finished, TokenDelta

API = "ollama"


class OllamaRenderer:
    """One chat or generate answer: NDJSON lines, or the last line alone with all the text."""

    media_type = MEDIA_TYPE  # of the streamed answer (``surfaces.base.answer``)

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def frames(self, opened: Opened, first: TokenDelta | Finished) -> AsyncGenerator[bytes, None]:
        """The NDJSON lines from ``first`` on."""
        return ndjson_lines(opened, first, self.shape, display(opened.parsed.model))

    def body(self, opened: Opened, results: list[ChoiceResult]) -> dict[str, Any]:
        """The whole answer: the final object with all the text, thinking and tool calls."""
        fields = durations(opened.record, opened.stream.usage)
        result = results[0]  # thinking split out (``think``) before tool calls (``answer``)
        return last(self.shape, display(opened.parsed.model), result, fields, result.reasoning)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    body = json.dumps({"error": message}, ensure_ascii=False)
    return Response(body, status, headers, media_type="application/json")


def render_error(request: Request, exc: MlxdError | HTTPException) -> Response:
    """An error in Ollama's shape, with the request id (and Retry-After when overloaded)."""
    headers = {REQUEST_ID_HEADER: record_of(request).request_id}
    if isinstance(exc, HTTPException):
        return error_response(exc.status_code, str(exc.detail), headers)
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return error_response(exc.status_code, exc.message, headers)


def _chat_renderer(parsed: ParsedRequest) -> OllamaRenderer:
    return OllamaRenderer(ChatShape())


def _generate_renderer(parsed: ParsedRequest) -> OllamaRenderer:
    return OllamaRenderer(GenerateShape())


CHAT = Surface(API, "chat", schemas.parse_chat, _chat_renderer, render_error)
GENERATE = Surface(API, "generate", schemas.parse_generate, _generate_renderer, render_error)
