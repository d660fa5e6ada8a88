"""API keys: who may call ``/v1/*``, at which priority tier, and how often.

Off when no key is configured. With keys, every ``/v1/*`` request needs one, as
``Authorization: Bearer <key>`` (OpenAI SDK) or ``x-api-key: <key>`` (Anthropic SDK); keys are
compared as SHA-256 digests with ``hmac.compare_digest``, against every key without an early
exit, so timing says nothing about which key or how much of it matched. ``/health`` is always
open; ``/metrics`` needs the admin key (when there is one) from non-loopback clients. Keys never
appear in responses or logs: records and messages carry the key's *name*.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxd.config import ApiKey
from mlxd.errors import MlxdError, RateLimited, Unauthorized
from mlxd.gateway.http.accesslog import scope_record
from mlxd.gateway.http.ratelimit import RateLimiter, retry_after

API_PREFIX = "/v1/"
METRICS_PATH = "/metrics"
_MISSING = "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
_INVALID = "Incorrect API key provided"


class KeyRing:
    """The configured keys, matched in constant time.

    Args:
        keys: the accepted keys; empty means authentication is off.
    """

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._digests = [(_digest(k.key), k) for k in keys]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def match(self, presented: str) -> ApiKey | None:
        """The key equal to ``presented``, or ``None``; every key is compared, whatever matches."""
        digest = _digest(presented)
        found = None
        for key_digest, key in self._digests:
            if hmac.compare_digest(digest, key_digest):
                found = key
        return found


def presented_key(headers: Headers) -> str | None:
    """The key a client sent: ``Authorization: Bearer <key>``, else ``x-api-key``."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or None


def is_loopback(client: tuple[str, int] | None) -> bool:
    """True for 127.0.0.0/8 and ::1, and for clients with no address (a Unix socket)."""
    if client is None:
        return True
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


class ApiKeyAuth:
    """ASGI middleware: API keys and rate limits on ``/v1/*``, the admin key on ``/metrics``.

    On success the key goes on the request's record (``record.key``): its tier caps the request
    priority and its name labels the access log. Tokens are charged when the response is done.

    Args:
        app: the app to wrap (inside ``AccessLog``, which makes the record).
        keys: the client keys; none turns authentication off.
        limiter: the per-key request and token limits.
        admin_key: guards ``/metrics`` from non-loopback clients; ``None`` leaves it open.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Sequence[ApiKey],
        limiter: RateLimiter,
        admin_key: str | None = None,
    ) -> None:
        self.app = app
        self.ring = KeyRing(keys)
        self.limiter = limiter
        self.admin = KeyRing([ApiKey(name="admin", key=admin_key)] if admin_key else [])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.ring and (path.startswith(API_PREFIX) or path == API_PREFIX[:-1]):
            await self._serve_api(scope, receive, send)
        elif self.admin and path == METRICS_PATH and not is_loopback(scope.get("client")):
            if self.admin.match(presented_key(Headers(scope=scope)) or "") is None:
                await _reject(Unauthorized(_INVALID), scope, receive, send)
                return
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    # Internal helpers

    async def _serve_api(self, scope: Scope, receive: Receive, send: Send) -> None:
        presented = presented_key(Headers(scope=scope))
        key = self.ring.match(presented or "")
        if key is None:
            error = Unauthorized(_MISSING if presented is None else _INVALID)
            await _reject(error, scope, receive, send)
            return
        scope_record(scope).key = key
        wait_s = self.limiter.admit(key.name, key.rpm, key.tpm)
        if wait_s > 0:
            seconds = retry_after(wait_s)
            message = f"API key {key.name!r} is over its rate limit; retry in {seconds}s"
            await _reject(RateLimited(message, retry_after=seconds), scope, receive, send)
            return
        if key.tpm is None:
            await self.app(scope, receive, send)
            return
        charged = False

        def charge() -> None:
            nonlocal charged
            if not charged:
                charged = True
                prompt_tokens, completion_tokens, _ = scope_record(scope).tokens()
                self.limiter.charge(key.name, prompt_tokens + completion_tokens, key.tpm)

        async def send_charged(message: Message) -> None:
            # Charge before the last body message: once a client sees its response end, its next
            # request must already find the tokens counted.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                charge()
            await send(message)

        try:
            await self.app(scope, receive, send_charged)
        finally:
            charge()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


async def _reject(error: MlxdError, scope: Scope, receive: Receive, send: Send) -> None:
    # Outside Starlette's exception handlers, so rendered here; AccessLog adds X-Request-Id.
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, Unauthorized) else {}
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(int(error.retry_after))
    await JSONResponse({"error": error.to_dict()}, error.status_code, headers)(scope, receive, send)
