"""Admin endpoints: daemon and worker status, stats, and control commands over ``/admin/*``.

Each model route sends one control message to the worker's control socket (``ControlClient``)
and renders the reply as JSON. Who may call them:

- requests that come through the daemon's admin Unix socket (``AdminSocketApp`` marks them): no
  key, the socket's 0700 directory is the guard, as for Docker's socket;
- requests over TCP: only with the admin key, ``Authorization: Bearer <key>`` (401 otherwise),
  whatever their address. Without ``--admin-key`` TCP gets 403: a same-host reverse proxy or
  tunnel makes every outside client look like loopback, and so does any local user's process.
"""

from __future__ import annotations

import hmac
import os
import time
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxd import __version__
from mlxd.errors import Forbidden, InvalidRequest, Unauthorized, WorkerUnavailable
from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.gateway.surfaces.openai import schemas
from mlxd.knobs import LIVE_KNOBS
from mlxd.protocol import codec
from mlxd.protocol.messages import (
    ControlReply,
    ControlRequest,
    Drain,
    FlushCache,
    GetStats,
    GetStatus,
    Pause,
    Resume,
    SetConfig,
    Shutdown,
)

MAX_BODY_BYTES = 64 * 1024

# URL action -> control message; each answers with an Ack.
ACTIONS: dict[str, type[Drain | Pause | Resume | FlushCache | Shutdown]] = {
    "drain": Drain,
    "pause": Pause,
    "resume": Resume,
    "flush-cache": FlushCache,
    "shutdown": Shutdown,
}
# Set in the ASGI scope by ``AdminSocketApp`` only; a client cannot put keys in a scope.
ADMIN_SOCKET = "mlxd.admin_socket"
# SetConfig's fields: JSON numbers are checked here so a bad one is a 400 naming the field.
SETTABLE: dict[str, type] = {k.field: k.kind for k in LIVE_KNOBS}


def admin_routes(pool: WorkerPool, admin_key: str | None) -> list[Route]:
    """The ``/admin/*`` routes over ``pool``, guarded by ``admin_key`` (see module docstring)."""
    admin = AdminEndpoints(pool, admin_key)
    model = "/admin/models/{name:path}"
    routes = [
        Route("/admin/status", admin.daemon_status, methods=["GET"]),
        Route(f"{model}/status", admin.model_status, methods=["GET"]),
        Route(f"{model}/stats", admin.model_stats, methods=["GET"]),
        Route(f"{model}/set", admin.set_config, methods=["POST"]),
        Route(f"{model}/load", admin.load, methods=["POST"]),
        Route(f"{model}/unload", admin.unload, methods=["POST"]),
    ]
    routes += [Route(f"{model}/{action}", admin.command, methods=["POST"]) for action in ACTIONS]
    return routes


class AdminEndpoints:
    """The admin endpoint functions, bound to the pool and the admin key.

    Args:
        pool: model name -> worker clients, control clients and supervisor view.
        admin_key: required over TCP; ``None`` leaves admin to the Unix socket alone.
    """

    def __init__(self, pool: WorkerPool, admin_key: str | None) -> None:
        self.pool = pool
        self.admin_key = admin_key
        self.started = time.monotonic()

    async def daemon_status(self, request: Request) -> Response:
        """``GET /admin/status``: the daemon and the supervisor's view of every worker."""
        self._authorize(request)
        models = [{**asdict(self.pool.info(n)), "name": n} for n in self.pool.names()]
        return JSONResponse(
            {
                "pid": os.getpid(),
                "version": __version__,
                "uptime_s": time.monotonic() - self.started,
                "memory": self.pool.budget(),
                "models": models,
            }
        )

    async def load(self, request: Request) -> Response:
        """``POST /admin/models/{name}/load`` (body ``{"wait": false}`` optional): start the
        model's worker, unloading LRU idle ones if the budget needs it; 503 if it cannot fit."""
        self._authorize(request)
        body = await request.body()
        options = schemas.parse_json(body) if body.strip() else {}
        wait = options.get("wait", True) if isinstance(options, dict) else None
        if not isinstance(wait, bool):
            raise InvalidRequest('send a JSON object like {"wait": false}', param="wait")
        name = request.path_params["name"]
        info = await self.pool.load(name, wait=wait)
        return JSONResponse({**asdict(info), "name": info.name or name})

    async def unload(self, request: Request) -> Response:
        """``POST /admin/models/{name}/unload``: drain and stop the worker (it loads again on
        its next request)."""
        self._authorize(request)
        name = request.path_params["name"]
        info = await self.pool.unload(name)
        return JSONResponse({**asdict(info), "name": info.name or name})

    async def model_status(self, request: Request) -> Response:
        """``GET /admin/models/{name}/status``: the worker's StatusReply."""
        return await self._ask(request, GetStatus)

    async def model_stats(self, request: Request) -> Response:
        """``GET /admin/models/{name}/stats``: the worker's StatsReply."""
        return await self._ask(request, GetStats)

    async def command(self, request: Request) -> Response:
        """``POST /admin/models/{name}/{drain|pause|resume|flush-cache|shutdown}``: an Ack."""
        action = request.url.path.rsplit("/", 1)[1]
        return await self._ask(request, ACTIONS[action])

    async def set_config(self, request: Request) -> Response:
        """``POST /admin/models/{name}/set`` with a JSON object of scheduler knobs: an Ack."""
        self._authorize(request)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise InvalidRequest("the request body is too large")
        changes = _parse_settings(schemas.parse_json(body))
        return await self._ask(request, SetConfig, **changes)

    # Internal helpers

    async def _ask(self, request: Request, kind: type[ControlRequest], **fields: Any) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        info = self.pool.info(name)  # ModelNotFound for an unknown name
        if info.state in ("failed", "stopped"):
            raise WorkerUnavailable(f"the worker for {name!r} is {info.state}: {info.last_error}")
        control = self.pool.control(name)
        reply = await control.request(kind(request_id=control.next_id(), **fields))
        return JSONResponse({"name": name, **_body(reply)})

    def _authorize(self, request: Request) -> None:
        if request.scope.get(ADMIN_SOCKET):
            return  # the admin Unix socket: file permissions decided who got here
        if self.admin_key is None:
            raise Forbidden(
                "admin over TCP needs the daemon to run with --admin-key; on its "
                "host the mlxd CLI reaches admin through its Unix socket"
            )
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(presented.encode(), self.admin_key.encode()):
            raise Unauthorized("a valid admin key is required: Authorization: Bearer <key>")


def _body(reply: ControlReply) -> dict[str, Any]:
    wire = codec.to_wire(reply)
    return {k: v for k, v in wire.items() if k not in ("type", "request_id")}


def _parse_settings(body: Any) -> dict[str, int | float]:
    if not isinstance(body, dict) or not body:
        raise InvalidRequest(f"send a JSON object with some of: {', '.join(SETTABLE)}")
    out: dict[str, int | float] = {}
    for key, value in body.items():
        if key not in SETTABLE:
            raise InvalidRequest(f"unknown setting {key!r}; use {', '.join(SETTABLE)}", param=key)
        is_int_field = SETTABLE[key] is int
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{key} must be a number", param=key)
        if is_int_field and not (isinstance(value, int) or value.is_integer()):
            raise InvalidRequest(f"{key} must be an integer", param=key)
        out[key] = int(value) if is_int_field else float(value)
    return out


class AdminSocketApp:
    """The gateway app as served on the admin Unix socket: marks each request's scope with
    ``ADMIN_SOCKET``, so admin endpoints take it without a key.

    Args:
        app: the same app the TCP server runs (its lifespan runs there, not here).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, ADMIN_SOCKET: True}
        await self.app(scope, receive, send)
