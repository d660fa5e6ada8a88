"""The remote backends together: one HTTP client per configured backend, their metrics, and the
proxy of each API that relays a request to a backend of either kind (translating where the
client's API and the backend's differ)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from mlxd.config import BackendSpec
from mlxd.errors import InvalidRequest
from mlxd.gateway.backends.remote.anthropic_proxy import AnthropicProxy
from mlxd.gateway.backends.remote.metrics import BackendMetrics
from mlxd.gateway.backends.remote.openai_proxy import OpenAIProxy
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.request import ApiRequest
from mlxd.gateway.routing.router import Target


class Remotes:
    """Every remote backend, and how a request for one of their models is served.

    Args:
        specs: the configured backends.
        metrics: the gateway's metrics (the backend families join its registry).
        environ: where each backend's ``api_key_env`` is read.
    """

    def __init__(
        self, specs: tuple[BackendSpec, ...], metrics: Metrics, environ: Mapping[str, str]
    ) -> None:
        self.backends = {b.name: RemoteBackend(b, b.api_key(environ)) for b in specs}
        self.metrics = BackendMetrics(metrics)
        self.metrics.watch(self.backends.values())
        self._openai = OpenAIProxy(self.backends, metrics, self.metrics)
        self._anthropic = AnthropicProxy(self.backends, metrics, self.metrics)
        self.created = int(time.time())

    async def serve(self, request: ApiRequest, target: Target) -> Response:
        """Relay ``request`` to ``target``'s backend, in the client's API.

        Raises:
            MlxdError: the request cannot go there, or the backend failed before answering.
        """
        kind = self.backends[target.backend].spec.kind
        endpoint, http, doc = request.endpoint, request.http, request.doc
        if request.api not in ("openai", "anthropic"):  # the Ollama API: local models for now
            raise InvalidRequest(
                f"model {target.name!r} is served by backend {target.backend!r}: the "
                f"{request.api} API serves local models only (use /v1/chat/completions)",
                param="model",
            )
        if endpoint in ("completions", "embeddings") and kind == "anthropic":
            what = (
                "text completions: use /v1/chat/completions"
                if endpoint == "completions"
                else "embeddings"
            )
            raise InvalidRequest(
                f"model {target.name!r} is served by backend {target.backend!r} of kind "
                f"anthropic, which has no {what}",
                param="model",
            )
        if request.api == "responses" and kind == "anthropic":
            raise InvalidRequest(
                f"model {target.name!r} is served by backend {target.backend!r} of kind "
                "anthropic: the Responses API reaches only openai-kind backends for now",
                param="model",
            )
        if request.api == "anthropic":
            return await self._anthropic.serve(http, target, doc, request.timeout_s)
        return await self._openai.serve(http, target, endpoint, doc, request.timeout_s)

    def model_row(self, target: Target) -> dict[str, Any]:
        """A remote model's ``/v1/models`` entry."""
        backend = self.backends[target.backend].spec
        return {
            "id": target.name,
            "object": "model",
            "created": self.created,
            "owned_by": backend.name,
            "backend": backend.name,
            "kind": backend.kind,
            "upstream_model": target.upstream,
            "state": "remote",
            "loaded": True,
            "reason": None,
            "aliases": [],
        }

    async def close(self) -> None:
        """Close every backend's connections."""
        for backend in self.backends.values():
            await backend.close()
