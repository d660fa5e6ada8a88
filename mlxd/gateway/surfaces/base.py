"""What an API surface is to the pipeline: a ``Surface`` for each generation endpoint (how its
body is validated, how a local answer is written, how an error looks) and an ``EmbedSurface``
for each embeddings endpoint, and ``answer``, which streams or collects a local answer through
a surface's ``Renderer``.

A new API is one surface package: a parser into ``ParsedRequest``, a ``Renderer`` of the
worker's events, an error shape, and routes in ``app.py`` that hand them to the ``Pipeline``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import MlxdError
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.http.body import CLIENT_CLOSED_REQUEST
from mlxd.gateway.request import ApiRequest, Opened, Parser
from mlxd.gateway.surfaces.collect import (
    ChoiceResult,
    collect_while_connected,
    first_while_connected,
)
from mlxd.gateway.surfaces.sse import EventStreamResponse
from mlxd.gateway.tools.calls import split_tool_calls
from mlxd.gateway.tools.reasoning import split_reasoning
from mlxd.protocol.messages import Embeddings, Finished, TokenDelta


class Renderer(Protocol):
    """How one response of a surface is written from the worker's events."""

    def frames(self, opened: Opened, first: TokenDelta | Finished) -> AsyncGenerator[bytes, None]:
        """The streamed answer, from its already received ``first`` event on."""
        ...

    def body(self, opened: Opened, results: list[ChoiceResult]) -> dict[str, Any]:
        """The whole answer, from its collected choices (tool calls split out)."""
        ...


ErrorRenderer = Callable[[Request, MlxdError | HTTPException], Response]
# What a surface does with a request it has read, before it is routed: the request to route
# (its model renamed, say), or the surface's own answer (Ollama's load and unload bodies).
Prepare = Callable[[ApiRequest], Awaitable[ApiRequest | Response]]


@dataclass(frozen=True, slots=True)
class Surface:
    """One generation endpoint of an API.

    Attributes:
        api: the wire family, ``"openai"`` or ``"anthropic"`` (a remote backend of another
            kind translates).
        endpoint: the API path under ``/v1/``.
        parse: body, ``X-Priority`` and the key's tier -> ``ParsedRequest``.
        renderer: a new response's ``Renderer`` for a parsed request.
        render_error: the API's error shape; ``None`` for the app's (OpenAI's) handler.
        headers: extra headers of a local answer, from its parsed request.
        prepare: what the surface does with a request before it is routed (``Prepare``).
    """

    api: str
    endpoint: str
    parse: Parser
    renderer: Callable[[Any], Renderer]
    render_error: ErrorRenderer | None = None
    headers: Callable[[Any], dict[str, str]] | None = None
    prepare: Prepare | None = None


@dataclass(frozen=True, slots=True)
class EmbedSurface:
    """One embeddings endpoint of an API.

    Attributes:
        api: the wire family (a remote backend of it is sent the body as it came).
        endpoint: the API path.
        parse: body, ``X-Priority`` and the key's tier -> ``EmbedRequest``.
        body: a local answer's JSON, from the request's record, its parsed request and the
            worker's vectors.
        render_error: the API's error shape; ``None`` for the app's (OpenAI's) handler.
        prepare: what the surface does with a request before it is routed (``Prepare``).
    """

    api: str
    endpoint: str
    parse: Parser
    body: Callable[[RequestRecord, Any, Embeddings], Any]
    render_error: ErrorRenderer | None = None
    prepare: Prepare | None = None


async def answer(
    http: Request,
    opened: Opened,
    renderer: Renderer,
    headers: dict[str, str],
    stall_timeout_s: float,
) -> Response:
    """Stream an opened request's answer or collect it. A client gone before the answer, or
    any error, cancels the request on the worker."""
    stream = opened.stream
    try:
        if opened.parsed.stream:
            first = await first_while_connected(http, stream, opened.deadline)
            if first is None:  # gone during prefill
                await stream.cancel()
                return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
            frames = renderer.frames(opened, first)
            media_type = getattr(renderer, "media_type", None)  # NDJSON for Ollama's
            return EventStreamResponse(
                stream, frames, headers, stall_timeout_s=stall_timeout_s, media_type=media_type
            )
        results = await collect_while_connected(http, stream, opened.deadline)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stream.cancel()
        raise
    if results is None:
        await stream.cancel()
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
    for result in results:
        if opened.parsed.reasoning:
            split = split_reasoning(result.text, result.thinking)
            result.reasoning, result.text = split.reasoning, split.answer
        if (parser := opened.parsed.new_tool_parser()) is not None:
            result.text, result.tool_calls = split_tool_calls(result.text, parser)
    return JSONResponse(renderer.body(opened, results), 200, headers)
