"""``GET /health``: what a load balancer or ``mlxd status`` asks. Answers from the gateway's own
state (the supervisor's view of each worker, each remote backend's recent outcomes): no worker
round-trip, so it stays fast under load, and never healthy while something keeps failing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.gateway.backends.upstream import RemoteBackend
from mlxd.gateway.local.pool import WorkerPool

# A backend counts as failing after this many failures in a row: one 502 from a cloud API is
# noise a fallback absorbs, three in a row is an outage the operator should see.
BACKEND_FAILING_AFTER = 3


class Health:
    """200 ``{"status": "ok"}``, or 503 ``{"status": "degraded", "failed": [...]}`` naming each
    failed model (``{"model", "reason"}``) and failing backend (``{"backend", "reason"}``)."""

    def __init__(self, pool: WorkerPool, backends: Sequence[RemoteBackend] = ()) -> None:
        self.pool = pool
        self.backends = backends

    async def endpoint(self, request: Request) -> Response:
        failed = self.failed_models() + self.failing_backends()
        if failed:
            return JSONResponse({"status": "degraded", "failed": failed}, 503)
        return JSONResponse({"status": "ok"})

    def failed_models(self) -> list[dict[str, Any]]:
        infos = ((name, self.pool.info(name)) for name in self.pool.names())
        return [{"model": n, "reason": i.last_error} for n, i in infos if i.state == "failed"]

    def failing_backends(self) -> list[dict[str, Any]]:
        return [{"backend": b.name, "reason": b.health.last_error} for b in self.backends
                if b.health.consecutive_failures >= BACKEND_FAILING_AFTER]  # fmt: skip
