"""The Ollama API's generation and embedding endpoints (``/api/chat``, ``/api/generate``,
``/api/embed``, ``/api/embeddings``) on the gateway's one request path.

Each is a surface the pipeline serves as it serves any other, with what Ollama does before a
request is routed (the surface's ``prepare``): its model names, so ``tiny:latest`` is the
pool's ``tiny`` (``names.resolve``); and its load and unload requests, a chat or generate body
with only a model (``ModelOnly``), answered here. ``keep_alive`` travels on the parsed request
(``keep_alive_s``), which the local backend hands to the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import InvalidRequest
from mlxd.gateway.http.accesslog import REQUEST_ID_HEADER, RequestRecord
from mlxd.gateway.request import ApiRequest
from mlxd.gateway.surfaces.base import EmbedSurface, Surface
from mlxd.gateway.surfaces.ollama import embed, surface
from mlxd.gateway.surfaces.ollama.body import model_only
from mlxd.gateway.surfaces.ollama.models import ModelPool
from mlxd.gateway.surfaces.ollama.names import display, resolve
from mlxd.gateway.surfaces.ollama.schemas import ModelOnly
from mlxd.gateway.surfaces.ollama.timing import embed_durations
from mlxd.protocol.messages import Embeddings

UNLOAD_REASON = "unloaded by an Ollama keep_alive: 0"


class Gateway(Protocol):
    """What the endpoints use of the pipeline (``Pipeline`` has these)."""

    async def generate(self, http: Request, surface: Surface, timeout_s: float) -> Response: ...

    async def embed(self, http: Request, surface: EmbedSurface) -> Response: ...


class ModelControl(ModelPool, Protocol):
    """What the load and unload requests use of the worker pool (``WorkerPool`` has these)."""

    async def load(self, name: str, wait: bool = True) -> Any: ...

    async def unload(self, name: str, reason: str = "unloaded on request") -> Any: ...

    def keep_alive(self, name: str, seconds: float | None) -> None: ...


class OllamaEndpoints:
    """The Ollama API's generation and embedding routes.

    Args:
        gateway: the pipeline that serves them.
        pool: the local models (their names, loads and unloads).
        remote: the remote models' names (their Ollama names resolve too).
        is_remote: whether a name (or alias) is a remote model's: nothing to load there.
        timeout_s: how long a chat or generate request may take.
    """

    def __init__(
        self,
        gateway: Gateway,
        pool: ModelControl,
        remote: list[str],
        is_remote: Callable[[str], bool],
        timeout_s: float,
    ) -> None:
        self.gateway = gateway
        self.pool = pool
        self.remote = remote
        self.is_remote = is_remote
        self.timeout_s = timeout_s
        self._chat = replace(surface.CHAT, prepare=self._prepare_chat)
        self._generate = replace(surface.GENERATE, prepare=self._prepare_generate)
        self._embed = self._embed_surface("embed", embed.parse_embed)
        self._embeddings = self._embed_surface("embeddings", embed.parse_embeddings)

    async def chat(self, http: Request) -> Response:
        """``POST /api/chat``."""
        return await self.gateway.generate(http, self._chat, self.timeout_s)

    async def generate(self, http: Request) -> Response:
        """``POST /api/generate``."""
        return await self.gateway.generate(http, self._generate, self.timeout_s)

    async def embed(self, http: Request) -> Response:
        """``POST /api/embed``."""
        return await self.gateway.embed(http, self._embed)

    async def embeddings(self, http: Request) -> Response:
        """``POST /api/embeddings`` (Ollama's older route: one prompt, one vector)."""
        return await self.gateway.embed(http, self._embeddings)

    # Internal helpers

    def _embed_surface(self, endpoint: str, parse: Any) -> EmbedSurface:
        return EmbedSurface(
            surface.API, endpoint, parse, _embed_body, surface.render_error, self._named
        )

    async def _prepare_chat(self, request: ApiRequest) -> ApiRequest | Response:
        return await self._prepare(request, is_chat=True)

    async def _prepare_generate(self, request: ApiRequest) -> ApiRequest | Response:
        return await self._prepare(request, is_chat=False)

    async def _prepare(self, request: ApiRequest, is_chat: bool) -> ApiRequest | Response:
        request = await self._named(request)
        if isinstance(parsed := request.parsed(), ModelOnly):
            return await self._model_only(request, parsed, is_chat)
        return request

    async def _named(self, request: ApiRequest) -> ApiRequest:
        """``request`` for the model its Ollama name (``tiny:latest``) spells (``tiny``)."""
        if request.model is None:
            return request
        names = self.pool.names()
        known = names + [a for n in names for a in self.pool.info(n).aliases] + self.remote
        return request.for_model(resolve(request.model, known))

    async def _model_only(self, request: ApiRequest, parsed: ModelOnly, is_chat: bool) -> Response:
        """Ollama's load (a body with only a model; its ``keep_alive`` then holds) and unload
        (``keep_alive: 0``)."""
        if self.is_remote(parsed.model):
            raise InvalidRequest(
                f"{parsed.model!r} is a remote model: there is nothing to load or unload",
                param="model",
            )
        if parsed.keep_alive_s == 0:
            self.pool.info(parsed.model)  # an unknown model is a 404
            await self.pool.unload(parsed.model, UNLOAD_REASON)
            reason = "unload"
        else:
            await self.pool.load(parsed.model)
            self.pool.keep_alive(parsed.model, parsed.keep_alive_s)
            reason = "load"
        body = model_only(display(parsed.model), is_chat, reason)
        return JSONResponse(body, 200, {REQUEST_ID_HEADER: request.record.request_id})


def _embed_body(record: RequestRecord, parsed: embed.OllamaEmbed, reply: Embeddings) -> Any:
    return embed.embed_body(parsed, display(parsed.model), reply, embed_durations(record))
