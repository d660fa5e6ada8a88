"""``GET /admin/overview``: the one JSON view of the daemon that the status page, `mlxd ps` and
`mlxd status` all read, so the page and the CLI never disagree.

It joins what the gateway already knows, without asking any worker on the request's path: the
pool's view of every model (``/admin/status``), each ready worker's last ``GetStatus`` /
``GetStats`` answers from the ``WorkerMetrics`` poller (every 2 s), and the last API requests
(``RecentRequests``: no prompts). ``?fresh=1`` polls the workers first, for a CLI command run
right after a load. Remote backends get a ``backends`` list: kind, URL, limits and health.

Who may read it: anyone who may call the API, and this host's CLI through the admin Unix socket.
Loopback clients need no key unless both API keys and an admin key are configured; other
clients send an API key or the admin key (403 when neither is configured). Its figures are
counts, names and timings; keys and prompts never are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd import __version__
from mlxd.config import ApiKey
from mlxd.errors import Forbidden, Unauthorized
from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.gateway.backends.local.worker_metrics import WorkerMetrics
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.http.auth import KeyRing, is_loopback, presented_key
from mlxd.gateway.ops.admin import ADMIN_SOCKET
from mlxd.gateway.ops.health import Health
from mlxd.gateway.ops.recent import RecentRequests
from mlxd.protocol import codec
from mlxd.protocol.messages import StatsReply, StatusReply


class Overview:
    """The ``GET /admin/overview`` endpoint.

    Args:
        pool: the models and the supervisor's view of their workers.
        workers: the poller whose latest answers give the workers' own figures.
        recent: the last API requests.
        api_keys: the client keys (any of them may read the overview).
        admin_key: the admin key (it may too).
        backends: the remote backends, whose health it shows.
        health: liveness and readiness (``/health``), shown with the rest.
    """

    def __init__(
        self,
        pool: WorkerPool,
        workers: WorkerMetrics,
        recent: RecentRequests,
        api_keys: tuple[ApiKey, ...],
        admin_key: str | None,
        backends: Sequence[RemoteBackend] = (),
        health: Health | None = None,
    ) -> None:
        self.pool = pool
        self.health = Health(pool, backends) if health is None else health
        self.backends = backends
        self.workers = workers
        self.recent = recent
        self.readers = KeyRing([*api_keys, *([ApiKey("admin", admin_key)] if admin_key else [])])
        self.open_on_loopback = admin_key is None or not api_keys
        self.started = time.monotonic()

    async def endpoint(self, request: Request) -> Response:
        """``GET /admin/overview[?fresh=1]``: see the module docstring."""
        self._authorize(request)
        if request.query_params.get("fresh") in ("1", "true"):
            await self.workers.poll_once()
        return JSONResponse(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The daemon, its models with their workers' figures, and the last requests."""
        latest = self.workers.latest()
        return {
            "pid": os.getpid(),
            "version": __version__,
            "uptime_s": time.monotonic() - self.started,
            "memory": self.pool.budget(),
            "models": [self._model(name, latest.get(name)) for name in self.pool.names()],
            "recent_requests": self.recent.rows(),
            "backends": [b.describe() for b in self.backends],  # remote ones: health, no key
            "health": self.health.report(),
        }

    # Internal helpers

    def _model(self, name: str, answers: tuple[StatusReply, StatsReply] | None) -> dict[str, Any]:
        info = self.pool.info(name)
        remote = self.pool.control(name).endpoint.startswith("tcp://")
        worker = None
        if answers is not None and info.state == "ready":
            status, stats = answers
            worker = {"status": _body(status), "stats": _body(stats)}
        return {
            **asdict(info),
            "name": name,
            "backend": "remote" if remote else "local",
            "replicas": len(info.replica_rows) or 1,
            "worker": worker,
        }

    def _authorize(self, request: Request) -> None:
        if request.scope.get(ADMIN_SOCKET):  # this host's CLI, through the 0700 admin socket
            return
        presented = presented_key(request.headers)
        if presented is not None and self.readers.match(presented) is not None:
            return
        if self.open_on_loopback and is_loopback(request.client):
            return
        if not self.readers:
            raise Forbidden("the overview is only open to loopback clients when no key is set")
        raise Unauthorized("send an API key or the admin key: Authorization: Bearer <key>")


def _body(reply: StatusReply | StatsReply) -> dict[str, Any]:
    wire = codec.to_wire(reply)
    return {k: v for k, v in wire.items() if k not in ("type", "request_id")}
