"""What a remote model's request goes through in either API's proxy: the backend chosen and
sent the body, then a whole answer collected or a stream's first event awaited. Each proxy says
how its API's bodies are observed (usage, first token) and how its stream is framed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import MlxdError, UpstreamError
from mlxd.gateway.backends.remote.metrics import BackendMetrics
from mlxd.gateway.backends.remote.relay import (
    BACKEND_HEADER,
    Done,
    finisher,
    read_json,
    take_priority,
)
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, RequestRecord, record_of
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.routing.router import Target

E = TypeVar("E")


class Proxy:
    """The base of ``OpenAIProxy`` and ``AnthropicProxy``.

    Args:
        backends: backend name -> its client.
        metrics: the gateway's per-model metrics (in flight, time to first token).
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

    def _observe(self, record: RequestRecord, body: Any) -> None:
        """Take usage, the finish reason and the first token's time from an answer or event."""
        raise NotImplementedError

    def _begin(
        self, request: Request, target: Target, doc: dict[str, Any]
    ) -> tuple[RequestRecord, RemoteBackend, str, dict[str, Any]]:
        """The request's record and backend, its priority and ``doc`` without that field."""
        backend = self.backends[target.backend]
        record = record_of(request)
        record.model, record.backend = target.name, backend.name
        record.stream = doc.get("stream") is True
        priority, doc = take_priority(request, doc)
        return record, backend, priority, doc

    async def _send(
        self,
        record: RequestRecord,
        backend: RemoteBackend,
        target: Target,
        path: str,
        body: dict[str, Any],
        priority: str,
    ) -> tuple[httpx.Response, dict[str, str], Done]:
        """The backend's response, the headers of ours and its once-only finisher.

        Raises:
            MlxdError: the backend failed before anything was sent to the client.
        """
        started = time.perf_counter()
        try:
            response = await backend.send(path, body, record.request_id, priority)
        except MlxdError as exc:
            self.backend_metrics.done(backend.name, target.name, exc.code)
            raise
        headers = {REQUEST_ID_HEADER: record.request_id, BACKEND_HEADER: backend.name}
        return response, headers, finisher(self.backend_metrics, backend, target, response, started)

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
        self._observe(record, payload)
        return JSONResponse({**payload, "model": record.model}, 200, headers)

    async def _first(
        self, record: RequestRecord, backend: RemoteBackend, events: AsyncIterator[E], done: Done
    ) -> E:
        """A stream's first event: until it comes, a failure is still an HTTP error."""
        try:
            first = await anext(events)
        except StopAsyncIteration:
            await done(UpstreamError.code)
            raise UpstreamError(
                f"backend {backend.name!r} ended its stream before any event"
            ) from None
        except httpx.HTTPError as exc:
            error = backend.failure(exc)
            await done(error.code)
            raise error from None
        self.metrics.track(record)
        return first


def same(payload: dict[str, Any]) -> dict[str, Any]:
    """The reshape of an answer already in the client's API."""
    return payload
