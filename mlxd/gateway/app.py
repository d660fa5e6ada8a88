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

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxd.config import ServeConfig
from mlxd.errors import InternalError, MlxdError, Overloaded
from mlxd.gateway import api_schema
from mlxd.gateway.accesslog import REQUEST_ID_HEADER, AccessLog, RequestRecord
from mlxd.gateway.admin import admin_routes
from mlxd.gateway.anthropic.endpoints import AnthropicEndpoints
from mlxd.gateway.auth import ApiKeyAuth
from mlxd.gateway.backends.dispatch import Dispatcher
from mlxd.gateway.health import Health
from mlxd.gateway.local.pool import WorkerPool
from mlxd.gateway.local.worker_metrics import WorkerMetrics
from mlxd.gateway.metrics import Metrics
from mlxd.gateway.openai.embeddings import EmbeddingsEndpoint
from mlxd.gateway.openai.endpoints import OpenAIEndpoints
from mlxd.gateway.overview import Overview
from mlxd.gateway.ratelimit import RateLimiter
from mlxd.gateway.recent import RecentRequests
from mlxd.gateway.status_page import status_page_routes

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
    api = OpenAIEndpoints(config, pool, metrics)
    anthropic = AnthropicEndpoints(api)
    embeddings = EmbeddingsEndpoint(config, pool)
    environ = os.environ if environ is None else environ
    routed = Dispatcher(config, api, anthropic, embeddings, metrics, environ)
    recent = RecentRequests()  # the status page's last requests (no prompts)
    overview = Overview(pool, workers, recent, config.api_keys, config.admin_key,
                        list(routed.backends.values()))  # fmt: skip
    routes = [
        *status_page_routes(),
        Route("/admin/overview", overview.endpoint, methods=["GET"]),
        Route("/health", Health(pool, overview.backends).endpoint, methods=["GET"]),
        Route("/openapi.json", api_schema.endpoint(pool), methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
        Route("/v1/models", routed.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", routed.retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", routed.chat_completions, methods=["POST"]),
        Route("/v1/completions", routed.completions, methods=["POST"]),
        Route("/v1/messages", routed.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
        Route("/v1/embeddings", routed.embeddings, methods=["POST"]),
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
            await routed.close()

    admin_key = getattr(config, "admin_key", None)  # ServeConfig grows it with the admin API
    middleware = [  # outermost first: every response, even a 401, gets a record and a request id
        Middleware(AccessLog, routes=routes, on_finish=_both(metrics.finish, recent.add)),
        Middleware(ApiKeyAuth, keys=config.api_keys, limiter=RateLimiter(), admin_key=admin_key),
    ]
    handlers = {MlxdError: render_error, HTTPException: _render_http, Exception: _render_crash}
    return Starlette(
        routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers
    )


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
