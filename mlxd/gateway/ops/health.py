"""Liveness and readiness: what a load balancer, a systemd/launchd watchdog or `mlxd status`
asks.

``GET /health`` is the daemon's liveness: 200 while at least one model or backend can serve
(``"ok"``, or ``"degraded"`` naming each failed model and failing backend), 503 ``"down"`` only
when every one of them has failed. One failed model never takes the healthy ones out of a
load balancer. ``GET /health/ready?model=M`` is one model's readiness: 200 when it can serve
(loaded, or loaded on demand), 503 when it has failed (or its backend keeps failing), 404 for
an unknown name; without ``model``, 200 only when everything can serve.

Both answer from the gateway's own state (the supervisor's view of each worker, each remote
backend's recent outcomes): no worker round-trip, so they stay fast under load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.gateway.backends.remote.upstream import RemoteBackend

# A backend counts as failing after this many failures in a row: one 502 from a cloud API is
# noise a fallback absorbs, three in a row is an outage the operator should see.
BACKEND_FAILING_AFTER = 3


class Health:
    """The ``/health`` and ``/health/ready`` endpoints.

    Args:
        pool: the local models and the supervisor's view of their workers.
        backends: the remote backends.
        remote_models: remote model name (and alias) -> its backend's name.
    """

    def __init__(
        self,
        pool: WorkerPool,
        backends: Sequence[RemoteBackend] = (),
        remote_models: Mapping[str, str] | None = None,
    ) -> None:
        self.pool = pool
        self.backends = {b.name: b for b in backends}
        self.remote_models = dict(remote_models or {})

    async def live(self, request: Request) -> Response:
        """``GET /health``."""
        report = self.report()
        return JSONResponse(report, 503 if report["status"] == "down" else 200)

    async def ready(self, request: Request) -> Response:
        """``GET /health/ready[?model=M]``."""
        name = request.query_params.get("model")
        if name is None:
            report = self.report()
            return JSONResponse(report, 200 if report["status"] == "ok" else 503)
        row = self.model_readiness(name)
        return JSONResponse(row, 200 if row["ready"] else 503)

    def report(self) -> dict[str, Any]:
        """``status`` (ok / degraded / down), each model's and backend's readiness, and the
        failed ones with their reasons."""
        models = [self.model_readiness(name) for name in self.pool.names()]
        backends = [self._backend_readiness(b) for b in self.backends.values()]
        failed = [{"model": m["model"], "reason": m["reason"]} for m in models if not m["ready"]]
        failed += [
            {"backend": b["backend"], "reason": b["reason"]} for b in backends if not b["ready"]
        ]
        serving = sum(r["ready"] for r in models + backends)
        status = "ok" if not failed else "degraded" if serving else "down"
        return {"status": status, "models": models, "backends": backends, "failed": failed}

    def model_readiness(self, name: str) -> dict[str, Any]:
        """``{"model", "ready", "state", "reason"}`` for a local or remote model; a local name
        that is unknown raises ``ModelNotFound`` (404)."""
        backend = self.remote_models.get(name)
        if backend is not None:
            row = self._backend_readiness(self.backends[backend])
            ready, reason = row["ready"], row["reason"]
            return {"model": name, "ready": ready, "state": "remote", "reason": reason}
        info = self.pool.info(name)
        failed = info.state == "failed"
        reason = info.last_error if failed else None
        return {"model": name, "ready": not failed, "state": info.state, "reason": reason}

    def _backend_readiness(self, backend: RemoteBackend) -> dict[str, Any]:
        failing = backend.health.consecutive_failures >= BACKEND_FAILING_AFTER
        reason = backend.health.last_error if failing else None
        return {"backend": backend.name, "ready": not failing, "reason": reason}
