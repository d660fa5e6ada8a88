"""One record per HTTP request, an ``X-Request-Id`` on every response, one access-log line each.

``AccessLog`` is the outermost middleware: it makes the request's ``RequestRecord`` (which the
auth middleware, the endpoints and the stream observer fill in), and when the response is done
hands it to the metrics and writes one JSON line on the ``mlxd.access`` logger. The line holds
the key's *name*, never the key, and the prompt only when ``--log-prompts`` asked for it.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxd.config import ApiKey
from mlxd.gateway.http.body import CLIENT_CLOSED_REQUEST
from mlxd.protocol.messages import ChatPrompt, Prompt, TextPrompt, Usage

log = logging.getLogger("mlxd.access")

REQUEST_ID_HEADER = "X-Request-Id"
MAX_LOGGED_ID_CHARS = 128
_REQUEST_ID_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What one HTTP request did, filled in as it runs and read once when it ends.

    Times are ``time.perf_counter()`` readings. ``model`` is set only once the pool knows the
    model, so metric labels never take arbitrary client strings.
    """

    request_id: str
    method: str
    path: str
    start: float
    end: float = 0.0
    endpoint: str = ""
    status: int = 0
    model: str = ""
    stream: bool = False
    key: ApiKey | None = None
    prompt: Any = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    completion_seen: int = 0
    usage: Usage | None = None
    finish_reason: str | None = None
    in_flight: bool = False
    backend: str = ""  # with backends configured: "local" or the remote backend's name
    load_s: float = 0.0  # how long it waited for its local worker (a load, or nothing)
    sent_at: float = 0.0  # when it went to its worker or upstream
    done_at: float = 0.0  # when its answer's last event came

    def tokens(self) -> tuple[int, int, int]:
        """Prompt, completion and cached tokens: the worker's usage, or what streamed so far."""
        if self.usage is None:
            return 0, self.completion_seen, 0
        u = self.usage
        return u.prompt_tokens, u.completion_tokens, u.cached_tokens


def record_of(request: Request) -> RequestRecord:
    """The record ``AccessLog`` made for ``request``."""
    return scope_record(request.scope)


def scope_record(scope: Scope) -> RequestRecord:
    """The record ``AccessLog`` made for the request of ``scope``."""
    record: RequestRecord = scope["state"]["record"]
    return record


def loggable_prompt(prompt: Prompt) -> Any:
    """The prompt as JSON for ``--log-prompts``: chat messages, text, or token ids."""
    if isinstance(prompt, ChatPrompt):
        return prompt.messages
    if isinstance(prompt, TextPrompt):
        return prompt.text
    return prompt.token_ids


class AccessLog:
    """ASGI middleware: a ``RequestRecord`` and an ``X-Request-Id`` for every HTTP request.

    Args:
        app: the app to wrap.
        routes: the app's routes, to label requests that never reached one (401, 404...).
        on_finish: called with each record once its response is done (the metrics).
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[BaseRoute] = (),
        on_finish: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.app = app
        self.routes = routes
        self.on_finish = on_finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get(REQUEST_ID_HEADER) or secrets.token_hex(16)
        record = RequestRecord(request_id, scope["method"], scope["path"], time.perf_counter())
        state = scope.setdefault("state", {})
        state["record"], state["request_id"] = record, request_id
        header = (_REQUEST_ID_KEY, request_id.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = list(message.get("headers", ()))
                if all(name.lower() != _REQUEST_ID_KEY for name, _ in headers):
                    message = {**message, "headers": [*headers, header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            record.status = record.status or 500
            raise
        finally:
            self._finish(record, scope)

    # Internal helpers

    def _finish(self, record: RequestRecord, scope: Scope) -> None:
        record.end = time.perf_counter()
        record.status = record.status or CLIENT_CLOSED_REQUEST
        record.endpoint = self._endpoint(scope)
        if self.on_finish is not None:
            self.on_finish(record)
        if log.isEnabledFor(logging.INFO):
            log.info(access_line(record))

    def _endpoint(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:  # rejected before routing: find the route it was meant for
            route = next((r for r in self.routes if r.matches(scope)[0] != Match.NONE), None)
        return str(getattr(route, "path", "other"))


def access_line(record: RequestRecord) -> str:
    """One request as a compact JSON object (no key, no prompt unless the record holds one)."""
    line = access_fields(record)
    if record.prompt is not None:
        line["prompt"] = record.prompt
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


def access_fields(record: RequestRecord) -> dict[str, Any]:
    """The access line's fields, never the prompt: what the status page shows of a request."""
    prompt_tokens, completion_tokens, cached_tokens = record.tokens()
    first = record.first_token_at
    return {
        "request_id": record.request_id[:MAX_LOGGED_ID_CHARS],
        "method": record.method,
        "endpoint": record.path,
        "status": record.status,
        "model": record.model or None,
        **({"backend": record.backend} if record.backend else {}),
        "key": record.key.name if record.key is not None else None,
        "stream": record.stream,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "finish_reason": record.finish_reason,
        "ttft_ms": None if first is None else round((first - record.start) * 1000, 2),
        "e2e_ms": round((record.end - record.start) * 1000, 2),
    }
