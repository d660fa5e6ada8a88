"""The Anthropic Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Requests are translated (``schemas``) into the chat request the OpenAI endpoints
serve and run through the same path (``OpenAIEndpoints.open_request``); answers are rendered in
Anthropic's shapes (``events``), errors too: ``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import InvalidRequest, MlxdError, Overloaded
from mlxd.gateway.accesslog import REQUEST_ID_HEADER, record_of
from mlxd.gateway.anthropic.events import error_type, message_body, message_events
from mlxd.gateway.anthropic.schemas import parse_count_tokens, parse_messages
from mlxd.gateway.body import read_body
from mlxd.gateway.openai import schemas
from mlxd.gateway.openai.endpoints import OpenAIEndpoints
from mlxd.protocol.messages import CountTokens


class AnthropicEndpoints:
    """The Messages endpoints, served through the OpenAI endpoints' request path.

    Args:
        api: the OpenAI endpoints (config, worker pool, metrics, request ids).
    """

    def __init__(self, api: OpenAIEndpoints) -> None:
        self.api = api

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``."""
        try:
            return await self.serve_messages(request)
        except (MlxdError, HTTPException) as exc:
            return render_error(request, exc)

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, without running the model."""
        try:
            return await self._count_tokens(request)
        except (MlxdError, HTTPException) as exc:
            return render_error(request, exc)

    # Internal helpers

    async def serve_messages(self, request: Request) -> Response:
        """``messages`` that raises its errors instead of answering them: the dispatcher fails
        over on a local model that is unavailable before the answer starts."""
        timeout_s = self.api.config.chat_timeout_s
        opened = await self.api.open_request(request, parse_messages, timeout_s)
        parsed, stream, deadline = opened.parsed, opened.stream, opened.deadline
        message_id = f"msg_{secrets.token_hex(12)}"
        return await self.api.answer(
            request, opened,
            lambda first: message_events(stream, first, parsed, message_id, deadline),
            lambda results: message_body(message_id, parsed.model, results[0], stream.usage),
        )  # fmt: skip

    async def _count_tokens(self, request: Request) -> Response:
        record = record_of(request)
        body = schemas.parse_json(await read_body(request, self.api.config.max_body_bytes))
        parsed = parse_count_tokens(body)
        worker = await self.api.pool.client(parsed.model)
        record.model = parsed.model
        request_id = f"{record.request_id[:64]}.count.{time.monotonic_ns():x}"
        msg = CountTokens(request_id=request_id, prompt=parsed.prompt)
        reply = await worker.count_tokens(msg, self.api.config.chat_timeout_s)
        headers = {REQUEST_ID_HEADER: record.request_id}
        return JSONResponse({"input_tokens": reply.num_tokens}, 200, headers)


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
