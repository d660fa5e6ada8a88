"""The gateway's one request path: read the body once, route, serve, render.

Every API endpoint comes here. Its surface's body is read and decoded once into an
``ApiRequest``; the router (``routing.router``) turns its model into a chain of targets (itself,
then its fallbacks); each target is served until one answers: by the local backend (the worker
pool) or a remote backend of another API, both opened as the internal event stream and
answered in the surface's shape by ``surfaces.base.answer``; or by a remote backend of the
client's own API, which relays the request as sent. A surface may prepare a request before it
is routed (``Surface.prepare``: Ollama's model names, and its load and unload bodies, which it
answers itself); an API's endpoints outside this file (``surfaces/ollama/endpoints.py``) call
``generate`` and ``embed``.

A target fails over to the next when it is unavailable before anything reached the client: a
local worker that is down or failed (``WorkerUnavailable``), a backend that refused the
connection, answered 5xx, broke or stayed silent past its timeout (``UpstreamError``,
``UpstreamTimeout``); and, for a model with ``fallback_on_busy``, a 429 (``Overloaded``: its
local queue is full, or its upstream is busy). Any other error (a bad request, a 429 without
that flag) is the client's answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.config import HttpLimits, RequestTimeouts
from mlxd.errors import (
    MlxdError,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
    WorkerUnavailable,
)
from mlxd.gateway.backends.local.backend import LocalBackend
from mlxd.gateway.backends.remote.relay import BACKEND_HEADER
from mlxd.gateway.backends.remote.remotes import Remotes
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, record_of
from mlxd.gateway.http.body import read_body
from mlxd.gateway.images.fetch import ImageFetcher
from mlxd.gateway.images.limits import ImageLimits
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.request import ApiRequest, Opened, Parser
from mlxd.gateway.routing.router import LOCAL, Router, Target
from mlxd.gateway.surfaces.anthropic import surface as anthropic
from mlxd.gateway.surfaces.anthropic.schemas import parse_count_tokens
from mlxd.gateway.surfaces.base import EmbedSurface, Surface, answer
from mlxd.gateway.surfaces.openai import surface as openai
from mlxd.gateway.surfaces.openai.embeddings import EMBEDDINGS
from mlxd.gateway.surfaces.openai.schemas import parse_json
from mlxd.gateway.surfaces.responses.store import ResponseStore
from mlxd.gateway.surfaces.responses.surface import StoredResponses, responses_surface

log = logging.getLogger(__name__)

FAILOVER_ERRORS = (WorkerUnavailable, UpstreamError, UpstreamTimeout)
_Local = Callable[[ApiRequest], Awaitable[Response]]


class Pipeline:
    """The API endpoints, each a surface over the one request path.

    Args:
        timeouts: each endpoint's, and a stalled stream's.
        http: the body limit.
        router: model name -> chain of targets.
        local: the worker pool's backend.
        remotes: the remote backends.
        metrics: the gateway's metrics (a failed-over attempt is untracked).
    """

    def __init__(
        self,
        timeouts: RequestTimeouts,
        http: HttpLimits,
        router: Router,
        local: LocalBackend,
        remotes: Remotes,
        metrics: Metrics,
    ) -> None:
        self.timeouts = timeouts
        self.http = http
        self.router = router
        self.local = local
        self.remotes = remotes
        self.metrics = metrics
        self.stored = StoredResponses(
            ResponseStore(http.max_stored_responses, http.max_stored_bytes)
        )
        self._responses = responses_surface(self.stored.store)
        self.images = ImageFetcher(_image_limits(http))

    async def chat_completions(self, http: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self.generate(http, openai.CHAT, self.timeouts.chat_timeout_s)

    async def completions(self, http: Request) -> Response:
        """``POST /v1/completions``."""
        return await self.generate(http, openai.COMPLETIONS, self.timeouts.completion_timeout_s)

    async def messages(self, http: Request) -> Response:
        """``POST /v1/messages``."""
        return await self.generate(http, anthropic.MESSAGES, self.timeouts.chat_timeout_s)

    async def responses(self, http: Request) -> Response:
        """``POST /v1/responses``."""
        return await self.generate(http, self._responses, self.timeouts.chat_timeout_s)

    async def embeddings(self, http: Request) -> Response:
        """``POST /v1/embeddings``: local models, or remote ones on ``openai`` backends."""
        return await self.embed(http, EMBEDDINGS)

    async def count_tokens(self, http: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, without running the model."""
        try:
            timeout_s = self.timeouts.chat_timeout_s
            request = await self._read(
                http, "anthropic", "messages/count_tokens", _count_parser, timeout_s
            )
            count = await self.local.count_tokens(request)
        except (MlxdError, HTTPException) as exc:
            return anthropic.render_error(http, exc)
        headers = {REQUEST_ID_HEADER: request.record.request_id}
        return JSONResponse({"input_tokens": count}, 200, headers)

    async def list_models(self, http: Request) -> Response:
        """``GET /v1/models``: the local models, then the remote ones."""
        created = self.remotes.created
        data = [self.local.model_row(name, created) for name in self.local.pool.names()]
        data += [self.remotes.model_row(t) for t in self.router.remote]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(self, http: Request) -> Response:
        """``GET /v1/models/{model}``."""
        name = http.path_params["model"]
        target = self.router.target(name)
        if target is not None and not target.is_local:
            return JSONResponse(self.remotes.model_row(target))
        if name not in self.local.pool.names():
            self.local.pool.info(name)  # an alias is fine; an unknown name raises ModelNotFound
        return JSONResponse(self.local.model_row(name, self.remotes.created))

    async def close(self) -> None:
        """Close the remote backends' connections."""
        await self.remotes.close()
        await self.images.close()

    async def generate(self, http: Request, surface: Surface, timeout_s: float) -> Response:
        """A generation endpoint of ``surface``: read, prepared, routed, served, rendered."""
        local = partial(self._generate_locally, surface=surface)
        return await self._endpoint(http, surface, timeout_s, local)

    async def embed(self, http: Request, surface: EmbedSurface) -> Response:
        """An embeddings endpoint of ``surface``: a local model's vectors in its shape, or a
        remote backend's answer relayed."""
        local = partial(self._embed_locally, surface=surface)
        return await self._endpoint(http, surface, self.timeouts.embeddings_timeout_s, local)

    # Internal helpers

    async def _endpoint(
        self, http: Request, surface: Surface | EmbedSurface, timeout_s: float, local: _Local
    ) -> Response:
        try:
            parse = surface.parse
            request = await self._read(http, surface.api, surface.endpoint, parse, timeout_s)
            if isinstance(prepared := await _prepare(request, surface), Response):
                return prepared
            events = surface if isinstance(surface, Surface) else None  # remote events rendered
            return await self._route(prepared, local, events)
        except (MlxdError, HTTPException) as exc:
            if surface.render_error is None:
                raise
            return surface.render_error(http, exc)

    async def _read(
        self, http: Request, api: str, endpoint: str, parse: Parser, timeout_s: float
    ) -> ApiRequest:
        doc = parse_json(await read_body(http, self.http.max_body_bytes))
        return ApiRequest(http, record_of(http), api, endpoint, doc, timeout_s, parse, self.images)

    async def _route(
        self, request: ApiRequest, local: _Local, surface: Surface | None = None
    ) -> Response:
        name = request.model
        chain = self.router.chain(name) if self.router.is_active and name is not None else []
        if not chain:  # not ours to route: the local backend answers (and explains)
            return await local(request)
        for target, fallback in zip(chain, [*chain[1:], None], strict=True):
            try:
                return await self._serve(request, target, local, surface)
            except (*FAILOVER_ERRORS, Overloaded) as exc:
                busy = isinstance(exc, Overloaded)
                if fallback is None or (busy and not self.router.fails_over_when_busy(target)):
                    raise
                self._fail_over(request, target, fallback, exc.message)
        raise AssertionError("a chain is never empty")

    async def _serve(
        self, request: ApiRequest, target: Target, local: _Local, surface: Surface | None
    ) -> Response:
        if not target.is_local:
            if surface is None or self.remotes.passes_through(request, target):
                return await self.remotes.serve(request, target)
            opened = await self.remotes.open(request, target)
            response = await self._answer(request, opened, surface)
            response.headers[BACKEND_HEADER] = target.backend
            return response
        request.record.backend = LOCAL
        response = await local(request.for_model(target.name))
        response.headers[BACKEND_HEADER] = LOCAL
        return response

    async def _generate_locally(self, request: ApiRequest, surface: Surface) -> Response:
        return await self._answer(request, await self.local.open(request), surface)

    async def _answer(self, request: ApiRequest, opened: Opened, surface: Surface) -> Response:
        """An opened request's answer (a local worker's or a remote backend's events), in its
        surface's shape."""
        headers = {REQUEST_ID_HEADER: request.record.request_id}
        if surface.headers is not None:
            headers.update(surface.headers(opened.parsed))
        renderer = surface.renderer(opened.parsed)
        return await answer(
            request.http, opened, renderer, headers, self.timeouts.stream_stall_timeout_s
        )

    async def _embed_locally(self, request: ApiRequest, surface: EmbedSurface) -> Response:
        parsed, reply = await self.local.embed(request)
        headers = {REQUEST_ID_HEADER: request.record.request_id}
        return JSONResponse(surface.body(request.record, parsed, reply), 200, headers)

    def _fail_over(self, request: ApiRequest, failed: Target, fallback: Target, why: str) -> None:
        record = request.record
        log.warning(
            "request %s: model %r failed before its answer started (%s); trying %r",
            record.request_id,
            failed.name,
            why,
            fallback.name,
        )
        self.metrics.untrack(record)
        self.remotes.metrics.failover(failed.name, fallback.name)


async def _prepare(request: ApiRequest, surface: Surface | EmbedSurface) -> ApiRequest | Response:
    """The request to route, as its surface prepared it, or the surface's own answer."""
    return request if surface.prepare is None else await surface.prepare(request)


def _image_limits(http: HttpLimits) -> ImageLimits:
    return ImageLimits(
        http.max_images,
        http.max_image_bytes,
        http.image_fetch_timeout_s,
        http.allow_private_image_urls,
    )


def _count_parser(body: Any, *_: str | None) -> Any:
    return parse_count_tokens(body)
