"""The remote backends together: one HTTP client per configured backend, their metrics, and
the two ways a request reaches one. A request in the backend's own API is relayed as the client
sent it (``serve``: every upstream field kept); any other (another API, or a surface with no
native upstream) is opened as an internal event stream (``open``) that the request's surface
renders, as it renders a local worker's."""

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
from mlxd.gateway.backends.remote.source import EventSource
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.request import ApiRequest, Opened
from mlxd.gateway.routing.router import Target

# The client API each backend kind speaks natively: requests in it are relayed as sent. The
# Responses API goes through the event path on every backend, so that its stored responses
# (``previous_response_id``) mean the same whichever backend answered.
NATIVE_API = {"openai": "openai", "anthropic": "anthropic"}


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
        self._source = EventSource(self.backends, metrics, self.metrics)
        self.created = int(time.time())

    def passes_through(self, request: ApiRequest, target: Target) -> bool:
        """Whether ``request`` is in the API of ``target``'s backend (``serve`` relays it)."""
        return NATIVE_API.get(request.api) == self.backends[target.backend].spec.kind

    async def serve(self, request: ApiRequest, target: Target) -> Response:
        """Relay ``request`` to ``target``'s backend as sent (``passes_through``, or
        embeddings, which are refused by an ``anthropic`` backend).

        Raises:
            MlxdError: the request cannot go there, or the backend failed before answering.
        """
        self._check_endpoint(request, target)
        if request.api not in NATIVE_API:  # an API no backend speaks, with no event path
            raise InvalidRequest(
                f"model {target.name!r} is served by backend {target.backend!r}: "
                f"{request.api} {request.endpoint} serves local models only",
                param="model",
            )
        endpoint, http, doc = request.endpoint, request.http, request.doc
        if request.api == "anthropic":
            return await self._anthropic.serve(http, target, doc, request.timeout_s)
        return await self._openai.serve(http, target, endpoint, doc, request.timeout_s)

    async def open(self, request: ApiRequest, target: Target) -> Opened:
        """Send ``request`` to ``target``'s backend in the backend's API; its answer as the
        internal event stream (``source``).

        Raises:
            MlxdError: the request cannot go there, or the backend failed before answering.
        """
        self._check_endpoint(request, target)
        return await self._source.open(request, target)

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

    def _check_endpoint(self, request: ApiRequest, target: Target) -> None:
        if self.backends[target.backend].spec.kind != "anthropic":
            return
        if request.endpoint not in ("completions", "embeddings"):
            return
        what = (
            "text completions: use /v1/chat/completions"
            if request.endpoint == "completions"
            else "embeddings"
        )
        raise InvalidRequest(
            f"model {target.name!r} is served by backend {target.backend!r} of kind "
            f"anthropic, which has no {what}",
            param="model",
        )
