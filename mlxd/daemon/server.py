"""The daemon's servers: uvicorn on TCP for the API, and the same app on the admin Unix socket.

Both run in one event loop, the gateway's, which also runs the supervisor's watcher. The TCP
server owns the lifespan (the supervisor starts and stops with it) and the signal handlers; the
admin server starts once the app has started and stops when the TCP server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxd.config import ServeConfig, data_dir
from mlxd.errors import ConfigError, ShuttingDown

if TYPE_CHECKING:
    from mlxd.daemon.supervisor import Supervisor

STARTUP_FAILURE = 3  # `mlxd start`'s exit code when the app did not start
CUT_MARGIN_S = 5.0  # after the drain timeout: for cut requests to send their error and close

log = logging.getLogger("mlxd")


def serve(config: ServeConfig, log_level: str, progress: Callable[[str], None]) -> int:
    """Run the daemon in the foreground until SIGINT/SIGTERM: 0 after a graceful stop,
    ``STARTUP_FAILURE`` if the app never started. ``progress`` gets one-line notes for the user."""
    from mlxd.daemon.supervisor import Supervisor

    runtime_dir = Path(tempfile.mkdtemp(prefix="mlxd-"))  # mode 0700: only we can connect
    supervisor = Supervisor(config, runtime_dir, log_level=log_level.upper())
    try:
        # Before the gateway's imports (a second): each worker's own (seconds: MLX, mlx-lm)
        # overlap them instead of following them.
        supervisor.preload()
        return _serve_app(config, supervisor, log_level, progress)
    finally:
        supervisor.abandon()


def _serve_app(
    config: ServeConfig, supervisor: Supervisor, log_level: str, progress: Callable[[str], None]
) -> int:
    """The gateway's app on its listeners, ``supervisor`` started and stopped by its lifespan."""
    import uvicorn

    from mlxd.daemon.admin_socket import AdminSocket
    from mlxd.gateway.app import build_app
    from mlxd.gateway.http.request_log import RequestLogFile
    from mlxd.gateway.ops.admin import AdminSocketApp

    _warn_without_keys(config)
    if config.request_log is not None:
        RequestLogFile(Path(config.request_log), config.request_log_max_bytes).attach()
    app = build_app(config, supervisor)
    server = draining_server(
        _tcp_config(app, config, log_level), config.drain_timeout_s, _cut_with(supervisor, config)
    )
    # uvicorn re-raises the signal that stopped it once it has shut down; with these in place
    # that re-raise is a no-op, so a graceful stop exits 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    admin = AdminSocket(supervisor.runtime_dir, data_dir(), config.port)
    sock = admin.bind()
    progress(_admin_note(admin.path, config.admin_key is not None))
    admin_config = uvicorn.Config(
        AdminSocketApp(app),
        lifespan="off",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    more = []  # --ollama-port: the same app on a second port
    if config.ollama_port is not None:
        more.append(quiet_server(_ollama_config(app, config, config.ollama_port, log_level)))
    try:
        run_both(server, quiet_server(admin_config), sock, more)
    finally:
        admin.close()
    return 0 if server.started else STARTUP_FAILURE


def check_port_free(host: str, port: int) -> None:
    """``ConfigError`` unless ``host:port`` can be bound, checked before a model is prepared."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # As uvicorn binds: a port whose last connections linger in TIME_WAIT is free to it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def run_both(server: Any, admin: Any, sock: socket.socket, more: list[Any] | None = None) -> None:
    """Run uvicorn ``server`` (TCP, with the lifespan) and ``admin`` (the same app, on ``sock``)
    in one event loop, with ``more`` listeners of the app (``--ollama-port``). The others start
    once the app has started and stop when ``server`` does; ``server`` alone handles
    SIGINT/SIGTERM (see ``quiet_server``)."""

    async def both() -> None:
        main = asyncio.ensure_future(server.serve())
        while not server.started and not main.done():
            await asyncio.sleep(0.05)
        sides = [admin, *(more or [])] if server.started else []
        tasks = [asyncio.ensure_future(admin.serve(sockets=[sock]))] if sides else []
        tasks += [asyncio.ensure_future(m.serve()) for m in sides[1:]]
        try:
            await main
        finally:
            for side in sides:
                side.should_exit = True
            await asyncio.gather(*tasks)

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())
    with contextlib.suppress(OSError):
        os.unlink(sock.getsockname())


def draining_server(config: Any, drain_s: float, cut: Callable[[], None]) -> Any:
    """A uvicorn server whose shutdown calls ``cut`` once requests have run ``drain_s`` seconds
    past the signal, so each ends with an error of its own; uvicorn's own deadline
    (``CUT_MARGIN_S`` later) cancels only what still runs then, mid-body, a traceback each."""
    import uvicorn

    class _Draining(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            timer = asyncio.get_running_loop().call_later(drain_s, cut)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return _Draining(config)


def _cut_with(supervisor: Supervisor, config: ServeConfig) -> Callable[[], None]:
    """``draining_server``'s cut: every request still on a worker ends with ``ShuttingDown``."""
    drain = f"{config.drain_timeout_s:g} s"

    def cut() -> None:
        log.warning("requests still running %s after the stop signal are cut", drain)
        why = f"the server is shutting down: the request ran past the drain timeout ({drain})"
        supervisor.cut(ShuttingDown(why))

    return cut


def quiet_server(config: Any) -> Any:
    """A uvicorn server that leaves signals alone: the TCP server's handlers stop both."""
    import uvicorn

    class _Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _Quiet(config)


def _warn_without_keys(config: ServeConfig) -> None:
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_keys:
        log.warning(
            "listening on %s with no API key: anyone who can reach it can use it; require one "
            "with --api-key KEY (or MLXD_API_KEY=KEY) or --api-keys-file FILE",
            config.host,
        )


# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals httpx's pool
# expiry (the openai and anthropic clients), so a client could send on a connection the server
# was closing at that instant: "Server disconnected without sending a response" (seen in a
# loaded CI run). Longer than the common clients' idle expiry (httpx 5 s, aiohttp 15 s), the
# client always closes first.
KEEP_ALIVE_S = 65


def _tcp_config(app: Any, config: ServeConfig, log_level: str) -> Any:
    import uvicorn

    # No uvicorn access log: mlxd.access writes one richer line per request.
    grace = math.ceil(config.drain_timeout_s + CUT_MARGIN_S)  # ``draining_server`` cuts first
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=grace,
        timeout_keep_alive=KEEP_ALIVE_S,
        access_log=False,
    )


def _ollama_config(app: Any, config: ServeConfig, port: int, log_level: str) -> Any:
    """The ``--ollama-port`` listener: the same app (the TCP server runs its lifespan)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=config.host,
        port=port,
        log_level=log_level,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        access_log=False,
    )


def _admin_note(path: Path, has_key: bool) -> str:
    tcp = "with the admin key (Authorization: Bearer)" if has_key else "refused (no --admin-key)"
    return f"admin: this host's mlxd CLI uses the Unix socket {path}; over TCP {tcp}"
