"""Relays ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` to an
OpenAI-compatible backend, as the client sent them (other APIs reach it through ``source``).

The body goes upstream as the client sent it, with ``model`` set to the upstream's name; the
answer comes back with ``model`` set to the name the client knows. A stream is committed only
once its first event arrived, so a backend that fails before that can still be failed over
(``Pipeline._route``); after it, a failure ends the stream with an ``{"error": ...}`` event. The
request's record gets the backend, the usage and the time to first token, so the access log,
rate limits and per-model metrics treat remote models as local ones.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import Response

from mlxd.errors import UpstreamError
from mlxd.gateway.backends.remote.proxy import Proxy, same
from mlxd.gateway.backends.remote.readers import openai_usage
from mlxd.gateway.backends.remote.relay import Done, RelayResponse, read_sse_data
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.routing.router import Target
from mlxd.gateway.surfaces.sse import DONE, sse

log = logging.getLogger(__name__)

_DONE_DATA = "[DONE]"


class OpenAIProxy(Proxy):
    """Serves requests for remote models on OpenAI-compatible backends."""

    async def serve(
        self, request: Request, target: Target, path: str, doc: dict[str, Any], timeout_s: float
    ) -> Response:
        """Send ``doc`` to ``target``'s backend at ``path`` and answer with what it returns.

        Raises:
            MlxdError: the backend failed before anything was sent to the client.
        """
        record, backend, priority, doc = self._begin(request, target, doc)
        body = {**doc, "model": target.upstream}
        response, headers, done = await self._send(record, backend, target, path, body, priority)
        if not record.stream:
            return await self._collect(record, backend, response, headers, timeout_s, done, same)
        return await self._relay(record, backend, read_sse_data(response), headers, done)

    # Internal helpers

    def _observe(self, record: RequestRecord, body: Any) -> None:
        _observe_body(record, body, self.metrics)

    async def _relay(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        events: AsyncIterator[str],
        headers: dict[str, str],
        done: Done,
    ) -> Response:
        first = await self._first(record, backend, events, done)
        frames = self._frames(record, backend, first, events, done)
        return RelayResponse(frames, done, headers)

    async def _frames(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        first: str,
        events: AsyncIterator[str],
        done: Done,
    ) -> AsyncGenerator[bytes, None]:
        outcome = "ok"
        data: str | None = first
        try:
            while data is not None and data != _DONE_DATA:
                yield self._frame(record, backend, data)
                data = await anext(events, None)
            if data is None:
                outcome = UpstreamError.code
                cut = UpstreamError(f"backend {backend.name!r} ended its stream unfinished")
                yield sse({"error": cut.to_dict()})
        except httpx.HTTPError as exc:
            error = backend.failure(exc)
            outcome = error.code
            log.warning("request %s failed mid-stream: %s", record.request_id, error.message)
            yield sse({"error": error.to_dict()})
        except BaseException:  # cancelled or closed: the client went away
            outcome = "client_closed"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await done(outcome)
        yield DONE

    def _frame(self, record: RequestRecord, backend: RemoteBackend, data: str) -> bytes:
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            error = UpstreamError(f"backend {backend.name!r} sent an event that is not JSON")
            return sse({"error": error.to_dict()})
        if isinstance(chunk.get("error"), dict):
            message = str(chunk["error"].get("message", ""))
            chunk["error"] = {**chunk["error"], "message": backend.redact(message)}
            return sse(chunk)
        self._observe(record, chunk)
        return sse({**chunk, "model": record.model} if "model" in chunk else chunk)


def _observe_body(record: RequestRecord, chunk: dict[str, Any], metrics: Metrics) -> None:
    """Take usage, finish reason and the first token's time from a chunk or a whole answer."""
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            record.finish_reason = str(choice["finish_reason"])
        if _has_text(choice):
            record.completion_seen += 1
            if record.first_token_at is None:
                record.first_token_at = time.perf_counter()
                metrics.ttft.labels(record.model).observe(record.first_token_at - record.start)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        record.usage = openai_usage(usage)


def _has_text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else None
    source = delta if delta is not None else choice.get("message") or choice
    if not isinstance(source, dict):
        return False
    return bool(source.get("content") or source.get("text") or source.get("tool_calls"))
