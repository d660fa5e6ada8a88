"""The OpenAI-compatible endpoints: chat completions, completions, models, health.

Each endpoint parses with ``schemas``, sends one ``Generate`` per choice to the model's worker
(``choices``), then streams (``streaming``) or collects the events. Errors are raised as
``MlxdError`` and rendered by the app's one exception handler.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.config import ServeConfig
from mlxd.gateway.accesslog import REQUEST_ID_HEADER, RequestRecord, loggable_prompt, record_of
from mlxd.gateway.body import CLIENT_CLOSED_REQUEST, read_body
from mlxd.gateway.local.pool import WorkerPool
from mlxd.gateway.local.workers import StreamObserver
from mlxd.gateway.metrics import Metrics
from mlxd.gateway.openai import responses, schemas
from mlxd.gateway.openai.choices import Choices, generates
from mlxd.gateway.openai.chunks import ChatChunks, TextChunks
from mlxd.gateway.openai.collect import collect_while_connected, first_while_connected
from mlxd.gateway.openai.responses import ChoiceResult
from mlxd.gateway.openai.schemas import ParsedRequest
from mlxd.gateway.openai.streaming import ChunkFormat, EventStreamResponse, sse_events
from mlxd.gateway.openai.tools.calls import split_tool_calls
from mlxd.protocol.messages import Finished, TokenDelta, Usage

MAX_REQUEST_ID_CHARS = 128

_Builder = Callable[[str, str, int, list[ChoiceResult], Usage], dict[str, Any]]
_Parser = Callable[[Any, str | None, str | None], ParsedRequest]  # body, X-Priority, key tier
_ChunksFactory = Callable[[str, str, int, ParsedRequest], ChunkFormat]


@dataclass(slots=True)
class OpenRequest:
    """A parsed request whose choices are running on a worker."""

    parsed: ParsedRequest
    stream: Choices
    headers: dict[str, str]  # for the response: X-Request-Id
    deadline: float  # time.monotonic() by which the request must finish


def _chat_chunks(completion_id: str, model: str, created: int, p: ParsedRequest) -> ChunkFormat:
    return ChatChunks(completion_id, model, created, p.n, p.include_usage, p.new_tool_parser)


def _text_chunks(completion_id: str, model: str, created: int, p: ParsedRequest) -> ChunkFormat:
    return TextChunks(completion_id, model, created, p.n, p.include_usage)


class OpenAIEndpoints:
    """The endpoint functions, bound to the config and the worker pool they serve.

    Args:
        config: timeouts and the request body limit.
        pool: model name -> worker client.
        metrics: where requests are counted and timed.
    """

    def __init__(self, config: ServeConfig, pool: WorkerPool, metrics: Metrics) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.created = int(time.time())
        self._id_prefix = secrets.token_hex(3)
        self._id_counter = itertools.count()

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``."""
        data = [self.model_row(name) for name in self.pool.names()]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``."""
        name = request.path_params["model"]
        if name not in self.pool.names():
            self.pool.info(name)  # an alias is fine; an unknown name raises ModelNotFound
        return JSONResponse(self.model_row(name))

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._complete(
            request, schemas.parse_chat, self.config.chat_timeout_s,
            "chatcmpl", _chat_chunks, responses.chat_completion,
        )  # fmt: skip

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._complete(
            request, schemas.parse_completion, self.config.completion_timeout_s,
            "cmpl", _text_chunks, responses.text_completion,
        )  # fmt: skip

    # Internal helpers

    async def _complete(
        self,
        request: Request,
        parse: _Parser,
        timeout_s: float,
        id_prefix: str,
        chunks: _ChunksFactory,
        build: _Builder,
    ) -> Response:
        opened = await self.open_request(request, parse, timeout_s)
        p, stream, deadline = opened.parsed, opened.stream, opened.deadline
        completion_id, created = responses.new_id(id_prefix), int(time.time())
        return await self.answer(
            request, opened,
            lambda first: sse_events(stream, first, chunks(completion_id, p.model, created, p),
                                     deadline),
            lambda results: build(completion_id, p.model, created, results, stream.usage),
        )  # fmt: skip

    async def answer(
        self,
        request: Request,
        opened: OpenRequest,
        events: Callable[[TokenDelta | Finished], AsyncGenerator[bytes, None]],
        body: Callable[[list[ChoiceResult]], dict[str, Any]],
    ) -> Response:
        """Stream an opened request's answer (``events`` from its first event on) or collect it
        (``body`` of its choices, tool calls split out). A client gone before the answer, or
        any error, cancels the request on the worker. Shared with the Anthropic endpoint."""
        parsed, stream, headers, deadline = (
            opened.parsed, opened.stream, opened.headers, opened.deadline
        )  # fmt: skip
        try:
            if parsed.stream:
                first = await first_while_connected(request, stream, deadline)
                if first is None:  # gone during prefill
                    await stream.cancel()
                    return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
                stall_s = self.config.stream_stall_timeout_s
                return EventStreamResponse(stream, events(first), headers, stall_timeout_s=stall_s)
            results = await collect_while_connected(request, stream, deadline)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stream.cancel()
            raise
        if results is None:
            await stream.cancel()
            return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
        for result in results:
            if (parser := parsed.new_tool_parser()) is not None:
                result.text, result.tool_calls = split_tool_calls(result.text, parser)
        return JSONResponse(body(results), 200, headers)

    async def open_request(self, request: Request, parse: _Parser, timeout_s: float) -> OpenRequest:
        """Read and parse the body, then start its choices on the model's worker.

        Shared with the Anthropic endpoint. Raises ``MlxdError`` or ``HTTPException`` (413).
        """
        record = record_of(request)
        client_id, request_id = self._request_ids(record)
        body = schemas.parse_json(await read_body(request, self.config.max_body_bytes))
        tier = None if record.key is None else record.key.tier
        parsed = parse(body, request.headers.get("x-priority"), tier)
        worker = await self.pool.client(parsed.model)
        if parsed.parse_tools and not parsed.forced_tool_call:
            described = await worker.describe(self.config.chat_timeout_s)
            parsed = replace(parsed, tool_format=described.tool_parser)
        deadline = time.monotonic() + timeout_s
        observer = self._track(record, parsed)
        base = parsed.to_generate(request_id, timeout_s)
        stream = await Choices.open(worker, generates(base, parsed.n), observer)
        return OpenRequest(parsed, stream, {REQUEST_ID_HEADER: client_id}, deadline)

    def _request_ids(self, record: RequestRecord) -> tuple[str, str]:
        """The client's ``X-Request-Id`` (or the one made for it) and the unique id on the wire."""
        client_id = record.request_id
        unique = f"{self._id_prefix}{next(self._id_counter):x}"
        return client_id, f"{client_id[:MAX_REQUEST_ID_CHARS]}.{unique}"

    def _track(self, record: RequestRecord, parsed: ParsedRequest) -> StreamObserver:
        record.model, record.stream = parsed.model, parsed.stream
        if self.config.log_prompts:
            record.prompt = loggable_prompt(parsed.prompt)
        return self.metrics.track(record)

    def model_row(self, name: str) -> dict[str, Any]:
        """``name``'s ``/v1/models`` entry."""
        # Beyond OpenAI's fields: whether the model is loaded (a request loads it if not), and
        # why it failed (a failed model answers 503 until `mlxd load` tries it again).
        info = self.pool.info(name)
        reason = info.last_error if info.state == "failed" else None
        return {"id": name, "object": "model", "created": self.created, "owned_by": "mlxd",
                "state": info.state, "loaded": info.state == "ready", "reason": reason,
                "aliases": info.aliases, "replicas": len(info.replica_rows) or 1}  # fmt: skip
