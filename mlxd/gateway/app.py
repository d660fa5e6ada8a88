"""The gateway's Starlette app: routes in one list, a lifespan for the pool, OpenAI-shaped errors.

Run it with uvicorn: ``uvicorn.run(build_app(config, pool), host=config.host, port=config.port)``.
This package never imports mlx: the gateway only speaks the protocol.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxd.config import HttpLimits, RequestTimeouts, ServeConfig
from mlxd.errors import InternalError, MlxdError, Overloaded
from mlxd.gateway.backends.local.backend import LocalBackend
from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.gateway.backends.local.worker_metrics import WorkerMetrics
from mlxd.gateway.backends.remote.remotes import Remotes
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, AccessLog, RequestRecord
from mlxd.gateway.http.auth import ApiKeyAuth
from mlxd.gateway.http.ratelimit import RateLimiter
from mlxd.gateway.ops import openapi
from mlxd.gateway.ops.admin import admin_routes
from mlxd.gateway.ops.health import Health
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.ops.overview import Overview
from mlxd.gateway.ops.recent import RecentRequests
from mlxd.gateway.ops.status_page import status_page_routes
from mlxd.gateway.pipeline import Pipeline
from mlxd.gateway.routing.router import Router
from mlxd.gateway.surfaces.ollama.endpoints import OllamaEndpoints
from mlxd.gateway.surfaces.ollama.models import REFUSED, OllamaModels
from mlxd.protocol.messages import Ping

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def build_app(
    config: ServeConfig,
    pool: WorkerPool,
    metrics: Metrics | None = None,
    environ: Mapping[str, str] | None = None,
) -> Starlette:
    """The gateway ASGI app; its lifespan starts and stops ``pool``.

    Args:
        config: timeouts, limits (``chat_timeout_s``, ``max_body_bytes``...) and API keys.
        pool: model name -> ``WorkerClient``; ``StaticPool`` or the supervisor's pool.
        metrics: served at ``/metrics``; pass one to add sources (``Metrics.add_source``).
        environ: where remote backends' keys are read (``api_key_env``); default ``os.environ``.
    """
    metrics = Metrics(pool) if metrics is None else metrics
    workers = WorkerMetrics(pool)  # queue depth, running sequences, KV blocks, prefix cache
    metrics.add_source(workers.collect)
    environ = os.environ if environ is None else environ
    timeouts, http = config.piece(RequestTimeouts), config.piece(HttpLimits)
    local = LocalBackend(pool, metrics, timeouts, http.log_prompts)
    remotes = Remotes(config.backends, metrics, environ)
    api = Pipeline(timeouts, http, Router(config), local, remotes, metrics)
    recent = RecentRequests()  # the status page's last requests (no prompts)
    backends = list(remotes.backends.values())
    remote_models = {n: r.backend for r in config.remote_models for n in (r.name, *r.aliases)}
    health = Health(pool, backends, remote_models)
    keys, admin = config.api_keys, config.admin_key
    overview = Overview(pool, workers, recent, keys, admin, backends, health)
    routes = [
        *status_page_routes(),
        Route("/admin/overview", overview.endpoint, methods=["GET"]),
        Route("/health", health.live, methods=["GET"]),
        Route("/health/ready", health.ready, methods=["GET"]),
        Route("/openapi.json", openapi.endpoint(pool), methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Route("/v1/models", api.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", api.stored.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", api.stored.delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", api.stored.input_items, methods=["GET"]),
        *ollama_routes(api, pool),
        *admin_routes(pool, config.admin_key),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.start()
        await workers.start()
        try:
            yield
        finally:
            await workers.stop()
            await pool.stop()
            await api.close()

    admin_key = getattr(config, "admin_key", None)  # ServeConfig grows it with the admin API
    middleware = [  # outermost first: every response, even a 401, gets a record and a request id
        Middleware(AccessLog, routes=routes, on_finish=_both(metrics.finish, recent.add)),
        Middleware(ApiKeyAuth, keys=config.api_keys, limiter=RateLimiter(), admin_key=admin_key),
    ]
    handlers = {MlxdError: render_error, HTTPException: _render_http, Exception: _render_crash}
    return Starlette(
        routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers
    )


def ollama_routes(api: Pipeline, pool: WorkerPool) -> list[Route]:
    """The Ollama API (``/api/*``): generation and embeddings through the pipeline, the model
    listings, and the model-management routes mlxd refuses."""
    remote = [t.name for t in api.router.remote]
    timeout_s = api.timeouts.chat_timeout_s

    async def describe(name: str) -> Any:
        # Only asked of loaded models, on the control plane: it neither loads the model nor
        # counts as using it (an `ollama ps` must not keep a model loaded past its keep-alive).
        control = pool.control(name)
        return await control.request(Ping(request_id=control.next_id()), timeout_s)

    def is_remote(name: str) -> bool:
        target = api.router.target(name)
        return target is not None and not target.is_local

    models = OllamaModels(pool, remote, describe, api.http.max_body_bytes)
    ollama = OllamaEndpoints(api, pool, remote, is_remote, timeout_s)
    return [
        Route("/api/chat", ollama.chat, methods=["POST"]),
        Route("/api/generate", ollama.generate, methods=["POST"]),
        Route("/api/embed", ollama.embed, methods=["POST"]),
        Route("/api/embeddings", ollama.embeddings, methods=["POST"]),
        Route("/api/tags", models.tags, methods=["GET"]),
        Route("/api/ps", models.ps, methods=["GET"]),
        Route("/api/show", models.show, methods=["POST"]),
        Route("/api/version", models.version, methods=["GET"]),
        *(
            Route(f"/api/{what}", models.refused(what), methods=["POST", "DELETE"])
            for what in REFUSED
        ),
    ]


def _both(
    first: Callable[[RequestRecord], None], second: Callable[[RequestRecord], None]
) -> Callable[[RequestRecord], None]:
    def call(record: RequestRecord) -> None:
        first(record)
        second(record)

    return call


async def render_error(request: Request, exc: Exception) -> Response:
    """Render any ``MlxdError`` as ``{"error": {message, type, param, code}}``."""
    assert isinstance(exc, MlxdError)
    headers = {}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    request_id = getattr(request.state, "request_id", None)
    if request_id is not None:
        headers[REQUEST_ID_HEADER] = request_id
    return JSONResponse({"error": exc.to_dict()}, exc.status_code, headers)


async def _render_http(request: Request, exc: Exception) -> Response:
    # Routing (404/405) and the body limit (413) raise Starlette's HTTPException.
    assert isinstance(exc, HTTPException)
    error = {
        "message": f"{exc.detail} ({request.method} {request.url.path})",
        "type": "invalid_request_error",
        "param": None,
        "code": _HTTP_CODES.get(exc.status_code, "http_error"),
    }
    return JSONResponse({"error": error}, exc.status_code, exc.headers)


async def _render_crash(request: Request, exc: Exception) -> Response:
    # Starlette logs nothing itself here, and uvicorn logs the re-raised exception.
    log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return await render_error(request, InternalError("The server had an internal error"))
