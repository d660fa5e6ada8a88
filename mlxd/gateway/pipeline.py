"""The gateway's one request path: read the body once, route, serve, render.

Every API endpoint comes here. Its surface's body is read and decoded once into an
``ApiRequest``; the router (``routing.router``) turns its model into a chain of targets (itself,
then its fallbacks); each target is served until one answers: by the local backend (the worker
pool) or a remote backend of another API, both opened as the internal event stream and
answered in the surface's shape by ``surfaces.base.answer``; or by a remote backend of the
client's own API, which relays the request as sent.

A target fails over to the next when it is unavailable before anything reached the client: a
local worker that is down or failed (``WorkerUnavailable``), a backend that refused the
connection, answered 5xx, broke or stayed silent past its timeout (``UpstreamError``,
``UpstreamTimeout``); and, for a model with ``fallback_on_busy``, a 429 (``Overloaded``: its
local queue is full, or its upstream is busy). Any other error (a bad request, a 429 without
that flag) is the client's answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.config import HttpLimits, RequestTimeouts
from mlxd.errors import (
    InvalidRequest,
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
from mlxd.gateway.surfaces.base import Surface, answer
from mlxd.gateway.surfaces.ollama import embed as ollama_embed
from mlxd.gateway.surfaces.ollama import surface as ollama
from mlxd.gateway.surfaces.ollama.body import model_only
from mlxd.gateway.surfaces.ollama.names import display, resolve
from mlxd.gateway.surfaces.ollama.schemas import ModelOnly, OllamaRequest
from mlxd.gateway.surfaces.ollama.timing import TimedStream, Timing, elapsed_ns
from mlxd.gateway.surfaces.openai import surface as openai
from mlxd.gateway.surfaces.openai.embeddings import embeddings_body, parse_embeddings
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
        return await self._generate(http, openai.CHAT, self.timeouts.chat_timeout_s)

    async def completions(self, http: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._generate(http, openai.COMPLETIONS, self.timeouts.completion_timeout_s)

    async def messages(self, http: Request) -> Response:
        """``POST /v1/messages``."""
        return await self._generate(http, anthropic.MESSAGES, self.timeouts.chat_timeout_s)

    async def responses(self, http: Request) -> Response:
        """``POST /v1/responses``."""
        return await self._generate(http, self._responses, self.timeouts.chat_timeout_s)

    async def embeddings(self, http: Request) -> Response:
        """``POST /v1/embeddings``: local models, or remote ones on ``openai`` backends."""
        timeout_s = self.timeouts.embeddings_timeout_s
        request = await self._read(http, "openai", "embeddings", parse_embeddings, timeout_s)
        return await self._route(request, self._embed_locally)

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

    async def ollama_chat(self, http: Request) -> Response:
        """``POST /api/chat``."""
        return await self._ollama(http, ollama.CHAT)

    async def ollama_generate(self, http: Request) -> Response:
        """``POST /api/generate``."""
        return await self._ollama(http, ollama.GENERATE)

    async def ollama_embed(self, http: Request) -> Response:
        """``POST /api/embed``."""
        return await self._ollama_embed(http, "embed", ollama_embed.parse_embed)

    async def ollama_embeddings(self, http: Request) -> Response:
        """``POST /api/embeddings`` (Ollama's older route: one prompt, one vector)."""
        return await self._ollama_embed(http, "embeddings", ollama_embed.parse_embeddings)

    async def close(self) -> None:
        """Close the remote backends' connections."""
        await self.remotes.close()
        await self.images.close()

    # Internal helpers

    async def _generate(self, http: Request, surface: Surface, timeout_s: float) -> Response:
        try:
            parse = surface.parse
            request = await self._read(http, surface.api, surface.endpoint, parse, timeout_s)
            return await self._route(request, lambda r: self._generate_locally(r, surface), surface)
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
            sent = time.perf_counter()
            opened = await self.remotes.open(request, target)
            if surface.api == ollama.API:  # Ollama's durations, measured as for a local model
                opened.stream = TimedStream(opened.stream, Timing(request.record.start, 0.0, sent))
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

    async def _embed_locally(self, request: ApiRequest) -> Response:
        parsed, reply = await self.local.embed(request)
        headers = {REQUEST_ID_HEADER: request.record.request_id}
        return JSONResponse(embeddings_body(parsed.model, reply, parsed.encoding), 200, headers)

    # Internal helpers: the Ollama API

    async def _ollama(self, http: Request, surface: Surface) -> Response:
        try:
            timeout_s = self.timeouts.chat_timeout_s
            request = await self._read(
                http, surface.api, surface.endpoint, surface.parse, timeout_s
            )
            request = self._ollama_named(request)
            if isinstance(parsed := request.parsed(), ModelOnly):
                return await self._ollama_model_only(request, parsed, surface is ollama.CHAT)
            return await self._route(request, lambda r: self._ollama_locally(r, surface), surface)
        except (MlxdError, HTTPException) as exc:
            return ollama.render_error(http, exc)

    async def _ollama_embed(self, http: Request, endpoint: str, parse: Parser) -> Response:
        try:
            timeout_s = self.timeouts.embeddings_timeout_s
            request = await self._read(http, ollama.API, endpoint, parse, timeout_s)
            return await self._route(self._ollama_named(request), self._ollama_embed_locally)
        except (MlxdError, HTTPException) as exc:
            return ollama.render_error(http, exc)

    def _ollama_named(self, request: ApiRequest) -> ApiRequest:
        """``request`` for the model its Ollama name (``tiny:latest``) spells (``tiny``)."""
        if request.model is None:
            return request
        pool = self.local.pool
        known = pool.names() + [a for n in pool.names() for a in pool.info(n).aliases]
        known += [t.name for t in self.router.remote]
        return request.for_model(resolve(request.model, known))

    async def _ollama_locally(self, request: ApiRequest, surface: Surface) -> Response:
        load_s = await self._ollama_load(request)
        opened = await self.local.open(request)
        timing = Timing(request.record.start, load_s, time.perf_counter())
        opened.stream = TimedStream(opened.stream, timing)
        headers = {REQUEST_ID_HEADER: request.record.request_id}
        renderer = surface.renderer(opened.parsed)
        stall_s = self.timeouts.stream_stall_timeout_s
        response = await answer(request.http, opened, renderer, headers, stall_s)
        parsed: OllamaRequest = opened.parsed  # type: ignore[assignment]  # the surface's parse
        return self._ollama_keep_alive(response, parsed.model, parsed.keep_alive_s)

    async def _ollama_embed_locally(self, request: ApiRequest) -> Response:
        load_s = await self._ollama_load(request)
        embed, reply = await self.local.embed(request)
        parsed: ollama_embed.OllamaEmbed = embed  # type: ignore[assignment]  # the surface's parse
        fields = {"total_duration": elapsed_ns(request.record.start)}
        fields["load_duration"] = round(load_s * 1e9)
        body = ollama_embed.embed_body(parsed, display(parsed.model), reply, fields)
        response = JSONResponse(body, 200, {REQUEST_ID_HEADER: request.record.request_id})
        return self._ollama_keep_alive(response, parsed.model, parsed.keep_alive_s)

    async def _ollama_load(self, request: ApiRequest) -> float:
        """Seconds to get the model's worker: loading it if it was not loaded."""
        start = time.perf_counter()
        await self.local.pool.client(request.parsed().model)
        return time.perf_counter() - start

    async def _ollama_model_only(
        self, request: ApiRequest, parsed: ModelOnly, is_chat: bool
    ) -> Response:
        """Ollama's load (a body with only a model) and unload (``keep_alive: 0``)."""
        target = self.router.target(parsed.model)
        if target is not None and not target.is_local:
            raise InvalidRequest(
                f"{parsed.model!r} is a remote model: there is nothing to load or unload",
                param="model",
            )
        if parsed.keep_alive_s == 0:
            self.local.pool.info(parsed.model)  # an unknown model is a 404
            await self.local.pool.unload(parsed.model, "unloaded by an Ollama keep_alive: 0")
            reason = "unload"
        else:
            await self.local.pool.load(parsed.model)
            reason = "load"
        body = model_only(display(parsed.model), is_chat, reason)
        return JSONResponse(body, 200, {REQUEST_ID_HEADER: request.record.request_id})

    def _ollama_keep_alive(
        self, response: Response, model: str, keep_alive_s: float | None
    ) -> Response:
        """``keep_alive: 0``: the model unloads once the answer was sent. Other values leave
        the server's keep-alive (``--keep-alive``, per model ``keep_alive``) in charge."""
        if keep_alive_s == 0:
            response.background = BackgroundTask(self._ollama_unload, model)
        return response

    async def _ollama_unload(self, model: str) -> None:
        try:
            await self.local.pool.unload(model, "unloaded by an Ollama keep_alive: 0")
        except MlxdError as exc:  # an attached worker: not ours to stop
            log.warning("keep_alive 0: could not unload %r: %s", model, exc.message)

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


def _image_limits(http: HttpLimits) -> ImageLimits:
    return ImageLimits(
        http.max_images,
        http.max_image_bytes,
        http.image_fetch_timeout_s,
        http.allow_private_image_urls,
    )


def _count_parser(body: Any, *_: str | None) -> Any:
    return parse_count_tokens(body)
