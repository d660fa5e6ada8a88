"""Relays ``/v1/messages`` to an ``anthropic``-kind backend (the Messages API) as the client sent
it, streaming and not (other APIs reach it through ``source``).

The same contract as ``openai_proxy``: ``model`` swapped both ways, a stream committed only once
its first event arrived (so earlier failures can fail over), a later failure ending the stream
with Anthropic's ``error`` event, usage and first-token time put on the request's record.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import Response

from mlxd.gateway.backends.remote.proxy import Proxy, same
from mlxd.gateway.backends.remote.readers import anthropic_usage
from mlxd.gateway.backends.remote.relay import Done, RelayResponse, read_sse
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.routing.router import Target
from mlxd.protocol.messages import Usage

_INPUT_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicProxy(Proxy):
    """Serves ``/v1/messages`` for remote models on Anthropic-kind backends."""

    async def serve(
        self, request: Request, target: Target, doc: dict[str, Any], timeout_s: float
    ) -> Response:
        """Send ``doc`` to ``target``'s backend and answer with what it returns.

        Raises:
            MlxdError: the backend failed before anything was sent to the client.
        """
        record, backend, priority, doc = self._begin(request, target, doc)
        body = {**doc, "model": target.upstream}
        response, headers, done = await self._send(
            record, backend, target, "messages", body, priority
        )
        if not record.stream:
            return await self._collect(record, backend, response, headers, timeout_s, done, same)
        return await self._relay(record, backend, read_sse(response), headers, done)

    # Internal helpers

    def _observe(self, record: RequestRecord, body: Any) -> None:
        _observe_body(record, body, self.metrics)

    async def _relay(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        events: AsyncIterator[tuple[str, str]],
        headers: dict[str, str],
        done: Done,
    ) -> Response:
        first = await self._first(record, backend, events, done)
        return RelayResponse(self._frames(record, backend, first, events, done), done, headers)

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
            self._observe(record, body.get("message", body))
        return _event(name, json.dumps(body, separators=(",", ":")))


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


def _observe_body(record: RequestRecord, body: Any, metrics: Metrics) -> None:
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
    """``usage`` over what the stream said ``before``: message_start has the input (and cache)
    tokens, each message_delta the output so far; a count an event leaves out is kept."""
    now = anthropic_usage(usage)
    if before is None:
        return now
    prompt = now if any(k in usage for k in _INPUT_KEYS) else before
    completion = now if "output_tokens" in usage else before
    return Usage(
        prompt_tokens=prompt.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        cached_tokens=prompt.cached_tokens,
    )
