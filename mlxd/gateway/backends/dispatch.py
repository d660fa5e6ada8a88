"""The OpenAI endpoints when backends or fallbacks are configured: each request goes down its
model's chain of targets (``Router.chain``) until one answers.

A target fails over to the next when it is unavailable before anything reached the client: a
local worker that is down or failed (``WorkerUnavailable``), a backend that refused the
connection, answered 5xx, broke or stayed silent past its timeout (``UpstreamError``,
``UpstreamTimeout``); and, for a model with ``fallback_on_busy``, a 429 (``Overloaded``: its
local queue is full, or its upstream is busy). Any other error (a bad request, a 429 without
that flag) is the client's answer. Without
backends or fallbacks the local endpoints serve requests directly, exactly as before.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from mlxd.config import ServeConfig
from mlxd.errors import (
    InvalidRequest,
    MlxdError,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
    WorkerUnavailable,
)
from mlxd.gateway.accesslog import record_of
from mlxd.gateway.anthropic.endpoints import AnthropicEndpoints
from mlxd.gateway.anthropic.endpoints import render_error as render_anthropic_error
from mlxd.gateway.backends.anthropic_proxy import AnthropicProxy
from mlxd.gateway.backends.metrics import BackendMetrics
from mlxd.gateway.backends.openai_proxy import OpenAIProxy
from mlxd.gateway.backends.relay import BACKEND_HEADER
from mlxd.gateway.backends.router import LOCAL, Router, Target
from mlxd.gateway.backends.upstream import RemoteBackend
from mlxd.gateway.body import read_body
from mlxd.gateway.metrics import Metrics
from mlxd.gateway.openai import schemas
from mlxd.gateway.openai.embeddings import EmbeddingsEndpoint
from mlxd.gateway.openai.endpoints import OpenAIEndpoints

log = logging.getLogger(__name__)

FAILOVER_ERRORS = (WorkerUnavailable, UpstreamError, UpstreamTimeout)
_Endpoint = Callable[[Request], Awaitable[Response]]


class Dispatcher:
    """``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` over local and remote
    models.

    Args:
        config: timeouts, the body limit, the backends and remote models.
        local: the endpoints of the local worker pool.
        anthropic: the local ``/v1/messages`` endpoint.
        embeddings: the local ``/v1/embeddings`` endpoint.
        metrics: the gateway's metrics (the backend families join its registry).
        environ: where each backend's ``api_key_env`` is read.
    """

    def __init__(
        self,
        config: ServeConfig,
        local: OpenAIEndpoints,
        anthropic: AnthropicEndpoints,
        embeddings: EmbeddingsEndpoint,
        metrics: Metrics,
        environ: Mapping[str, str],
    ) -> None:
        self.config = config
        self.local = local
        self.anthropic = anthropic
        self.local_embeddings = embeddings
        self.metrics = metrics
        self.router = Router(config)
        self.backends = {b.name: RemoteBackend(b, b.api_key(environ)) for b in config.backends}
        self.backend_metrics = BackendMetrics(metrics)
        self.backend_metrics.watch(self.backends.values())
        self.proxy = OpenAIProxy(self.backends, metrics, self.backend_metrics)
        self.anthropic_proxy = AnthropicProxy(self.backends, metrics, self.backend_metrics)
        self.created = int(time.time())

    async def close(self) -> None:
        """Close every backend's connections."""
        for backend in self.backends.values():
            await backend.close()

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._dispatch(request, "chat/completions", self.local.chat_completions,
                                    self.config.chat_timeout_s)  # fmt: skip

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._dispatch(request, "completions", self.local.completions,
                                    self.config.completion_timeout_s)  # fmt: skip

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``: local models through the Anthropic endpoints, remote ones on
        ``anthropic`` backends relayed (errors in Anthropic's shape)."""
        try:
            return await self._dispatch(request, "messages", self.anthropic.serve_messages,
                                        self.config.chat_timeout_s)  # fmt: skip
        except (MlxdError, HTTPException) as exc:
            return render_anthropic_error(request, exc)

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: local models, or remote ones on ``openai`` backends."""
        return await self._dispatch(request, "embeddings", self.local_embeddings.create,
                                    self.config.embeddings_timeout_s)  # fmt: skip

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``: the local models, then the remote ones."""
        data = [self.local.model_row(name) for name in self.local.pool.names()]
        data += [self._remote_row(t) for t in self.router.remote]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``."""
        target = self.router.target(request.path_params["model"])
        if target is None or target.is_local:
            return await self.local.retrieve_model(request)
        return JSONResponse(self._remote_row(target))

    # Internal helpers

    async def _dispatch(
        self, request: Request, path: str, local: _Endpoint, timeout_s: float
    ) -> Response:
        if not self.router.is_active:
            return await local(request)
        body = await read_body(request, self.config.max_body_bytes)
        doc = schemas.parse_json(body)
        name = doc.get("model") if isinstance(doc, dict) else None
        chain = self.router.chain(name) if isinstance(name, str) else []
        if not chain:  # not ours to route: the local endpoint answers (and explains)
            return await local(_replayed(request, body))
        assert isinstance(doc, dict)
        for target, fallback in zip(chain, [*chain[1:], None], strict=True):
            try:
                return await self._serve(request, target, path, doc, local, timeout_s)
            except (*FAILOVER_ERRORS, Overloaded) as exc:
                busy = isinstance(exc, Overloaded)
                if fallback is None or (busy and not self.router.fails_over_when_busy(target)):
                    raise
                self._fail_over(request, target, fallback, exc.message)
        raise AssertionError("a chain is never empty")

    async def _serve(
        self,
        request: Request,
        target: Target,
        path: str,
        doc: dict[str, Any],
        local: _Endpoint,
        timeout_s: float,
    ) -> Response:
        if not target.is_local:  # the proxies translate between the APIs where kinds differ
            kind = self.backends[target.backend].spec.kind
            if path in ("completions", "embeddings") and kind == "anthropic":
                what = "text completions: use /v1/chat/completions" if path == "completions" \
                    else "embeddings"  # fmt: skip
                raise InvalidRequest(f"model {target.name!r} is served by backend "
                                     f"{target.backend!r} of kind anthropic, which has no "
                                     f"{what}", param="model")  # fmt: skip
            if path == "messages":
                return await self.anthropic_proxy.serve(request, target, doc, timeout_s)
            return await self.proxy.serve(request, target, path, doc, timeout_s)
        record_of(request).backend = LOCAL
        body = json.dumps({**doc, "model": target.name}).encode()
        response = await local(_replayed(request, body))
        response.headers[BACKEND_HEADER] = LOCAL
        return response

    def _fail_over(self, request: Request, failed: Target, fallback: Target, why: str) -> None:
        record = record_of(request)
        log.warning("request %s: model %r failed before its answer started (%s); trying %r",
                    record.request_id, failed.name, why, fallback.name)  # fmt: skip
        self.metrics.untrack(record)
        self.backend_metrics.failover(failed.name, fallback.name)

    def _remote_row(self, target: Target) -> dict[str, Any]:
        backend = self.backends[target.backend].spec
        return {"id": target.name, "object": "model", "created": self.created,
                "owned_by": backend.name, "backend": backend.name, "kind": backend.kind,
                "upstream_model": target.upstream, "state": "remote", "loaded": True,
                "reason": None, "aliases": []}  # fmt: skip


def _replayed(request: Request, body: bytes) -> Request:
    """``request`` with ``body`` to read again (ours was consumed); disconnects still come
    through."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)
