"""Relays ``/v1/messages`` to an ``anthropic``-kind backend (the Messages API), streaming and not.

The same contract as ``openai_proxy``: ``model`` swapped both ways, a stream committed only once
its first event arrived (so earlier failures can fail over), a later failure ending the stream
with Anthropic's ``error`` event, usage and first-token time put on the request's record.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import MlxdError, UpstreamError
from mlxd.gateway.accesslog import REQUEST_ID_HEADER, RequestRecord, record_of
from mlxd.gateway.backends import anthropic_to_openai
from mlxd.gateway.backends.metrics import BackendMetrics
from mlxd.gateway.backends.relay import (
    BACKEND_HEADER,
    Done,
    RelayResponse,
    finisher,
    read_json,
    sse_data,
    sse_events,
    take_priority,
)
from mlxd.gateway.backends.router import Target
from mlxd.gateway.backends.upstream import RemoteBackend
from mlxd.gateway.metrics import Metrics
from mlxd.protocol.messages import Usage


class AnthropicProxy:
    """Serves ``/v1/messages`` for remote models on Anthropic-kind backends.

    Args:
        backends: backend name -> its client.
        metrics: the gateway's per-model metrics.
        backend_metrics: the per-backend counters.
    """

    def __init__(
        self,
        backends: Mapping[str, RemoteBackend],
        metrics: Metrics,
        backend_metrics: BackendMetrics,
    ) -> None:
        self.backends = backends
        self.metrics = metrics
        self.backend_metrics = backend_metrics

    async def serve(
        self, request: Request, target: Target, doc: dict[str, Any], timeout_s: float
    ) -> Response:
        """Send ``doc`` to ``target``'s backend and answer with what it returns.

        Raises:
            MlxdError: the backend failed before anything was sent to the client.
        """
        backend = self.backends[target.backend]
        record = record_of(request)
        record.model, record.backend = target.name, backend.name
        record.stream = doc.get("stream") is True
        priority, doc = take_priority(request, doc)
        translated = backend.spec.kind == "openai"
        if translated:
            path, body = "chat/completions", anthropic_to_openai.request(doc, target.upstream)
        else:
            path, body = "messages", {**doc, "model": target.upstream}
        started = time.perf_counter()
        try:
            response = await backend.send(path, body, record.request_id, priority)
        except MlxdError as exc:
            self.backend_metrics.done(backend.name, target.name, exc.code)
            raise
        headers = {REQUEST_ID_HEADER: record.request_id, BACKEND_HEADER: backend.name}
        done = finisher(self.backend_metrics, backend, target, response, started)
        if not record.stream:
            reshape = partial(anthropic_to_openai.response, model=target.name) if translated \
                else _same  # fmt: skip
            return await self._collect(record, backend, response, headers, timeout_s, done,
                                       reshape)  # fmt: skip
        if translated:
            events = anthropic_to_openai.events(sse_data(response), target.name)
        else:
            events = sse_events(response)
        return await self._relay(record, backend, events, headers, done)

    # Internal helpers

    async def _relay(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        events: AsyncIterator[tuple[str, str]],
        headers: dict[str, str],
        done: Done,
    ) -> Response:
        try:
            first = await anext(events)
        except (StopAsyncIteration, httpx.HTTPError) as exc:
            empty = UpstreamError(f"backend {backend.name!r} ended its stream before any event")
            error = backend.failure(exc) if isinstance(exc, httpx.HTTPError) else empty
            await done(error.code)
            raise error from None
        self.metrics.track(record)
        return RelayResponse(self._frames(record, backend, first, events, done), done, headers)

    async def _collect(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        response: httpx.Response,
        headers: dict[str, str],
        timeout_s: float,
        done: Done,
        reshape: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> Response:
        payload = await read_json(backend, response, timeout_s, done, reshape)
        self.metrics.track(record)
        _observe(record, payload, self.metrics)
        return JSONResponse({**payload, "model": record.model}, 200, headers)

    async def _frames(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        first: tuple[str, str],
        events: AsyncIterator[tuple[str, str]],
        done: Done,
    ) -> AsyncGenerator[bytes, None]:
        outcome = "ok"
        event: tuple[str, str] | None = first
        try:
            while event is not None:
                yield self._frame(record, backend, *event)
                event = await anext(events, None)
        except httpx.HTTPError as exc:
            error = backend.failure(exc)
            outcome = error.code
            body = {"type": "error", "error": {"type": "api_error", "message": error.message}}
            yield _event("error", json.dumps(body))
        except BaseException:  # cancelled or closed: the client went away
            outcome = "client_closed"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await done(outcome)

    def _frame(self, record: RequestRecord, backend: RemoteBackend, name: str, data: str) -> bytes:
        try:
            body = json.loads(data)
        except ValueError:
            return _event(name, data)
        if isinstance(body, dict):
            if isinstance(body.get("message"), dict):  # message_start
                body["message"] = {**body["message"], "model": record.model}
            if isinstance(body.get("error"), dict):
                message = str(body["error"].get("message", ""))
                body["error"] = {**body["error"], "message": backend.redact(message)}
            _observe(record, body.get("message", body), self.metrics)
        return _event(name, json.dumps(body, separators=(",", ":")))


def _same(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


def _observe(record: RequestRecord, body: Any, metrics: Metrics) -> None:
    """Usage, stop reason and first-token time from a message, or a stream event's body."""
    if not isinstance(body, dict):
        return
    delta = body.get("delta")
    if body.get("type") == "content_block_delta" or isinstance(body.get("content"), list):
        record.completion_seen += 1
        if record.first_token_at is None:
            record.first_token_at = time.perf_counter()
            metrics.ttft.labels(record.model).observe(record.first_token_at - record.start)
    if isinstance(delta, dict) and delta.get("stop_reason"):
        record.finish_reason = str(delta["stop_reason"])
    if body.get("stop_reason"):
        record.finish_reason = str(body["stop_reason"])
    usage = body.get("usage")
    if isinstance(usage, dict):
        record.usage = _usage(usage, record.usage)


def _usage(usage: dict[str, Any], before: Usage | None) -> Usage:
    # A stream's message_start has input tokens, its message_delta the output so far.
    def count(key: str, old: int) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and value >= 0 else old

    prompt = before.prompt_tokens if before else 0
    completion = before.completion_tokens if before else 0
    cached = count("cache_read_input_tokens", before.cached_tokens if before else 0)
    return Usage(
        prompt_tokens=count("input_tokens", prompt),
        completion_tokens=count("output_tokens", completion),
        cached_tokens=cached,
    )
