"""One remote backend: an HTTP client with its key, headers, timeout and concurrency cap.

Every failure becomes an ``MlxdError`` that names the backend and never holds its key: the
upstream's own messages are redacted before they reach a client or a log, since some APIs
echo part of a bad key back ("Incorrect API key provided: sk-abc***xyz").
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import httpx

from mlxd.config import BackendSpec
from mlxd.errors import InvalidRequest, MlxdError, Overloaded, UpstreamError, UpstreamTimeout
from mlxd.gateway.backends.remote.breaker import Breaker
from mlxd.gateway.backends.remote.health import BackendHealth
from mlxd.gateway.backends.remote.slots import PrioritySlots

log = logging.getLogger(__name__)

REDACTED = "[redacted]"
CONNECT_TIMEOUT_S = 10.0
_PASSED_THROUGH = (400, 413, 422)  # the client's mistake, as the upstream saw it


class RemoteBackend:
    """A remote API's HTTP client (``httpx.AsyncClient``) and its concurrency slots.

    Args:
        spec: the backend's config (name, kind, base URL, timeout, headers, max_concurrency).
        api_key: the key read from ``spec.api_key_env`` (``None``: send none).
        transport: an httpx transport for tests at the outermost edge; ``None``: the network.
    """

    def __init__(
        self,
        spec: BackendSpec,
        api_key: str | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._secrets = [s for s in (api_key,) if s]
        timeout = httpx.Timeout(spec.timeout_s, connect=min(spec.timeout_s, CONNECT_TIMEOUT_S))
        self._client = httpx.AsyncClient(
            base_url=spec.base_url.rstrip("/") + "/",
            headers={**dict(spec.headers), **_auth_headers(spec.kind, api_key)},
            timeout=timeout,
            transport=transport,
        )
        limit = spec.max_concurrency
        self._slots = PrioritySlots(limit) if limit is not None else None
        self.health = BackendHealth()
        self.breaker = Breaker(spec.breaker_failures, spec.breaker_cooldown_s)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def send(
        self, path: str, body: Mapping[str, Any], request_id: str, priority: str = "normal"
    ) -> httpx.Response:
        """POST ``body`` to ``path`` and return the open (streamed) response once it is a 2xx.

        Waits for a concurrency slot first, in ``priority`` order; the caller must ``release``
        the response (which closes it and frees the slot) whatever happens next.

        Raises:
            UpstreamError: connection failed, a 5xx, a broken response, our key refused, or
                the circuit breaker is open (the backend failed too often lately).
            UpstreamTimeout: nothing came within the backend's ``timeout``.
            InvalidRequest: the upstream refused the request itself (400, 413, 422).
            Overloaded: the upstream said 429 (its ``Retry-After`` is kept).
        """
        if not self.breaker.allow():
            raise UpstreamError(
                f"backend {self.name!r} is failing; the next try is in "
                f"{self.breaker.retry_in():.0f}s (circuit breaker; last error: "
                f"{self.health.last_error})"
            )
        try:
            if self._slots is not None:
                await self._slots.acquire(priority)
        except BaseException:
            self.breaker.settled()
            raise
        try:
            response = await self._send(path, body, request_id)
        except (UpstreamError, UpstreamTimeout) as exc:
            self.health.failed(exc.message, time.time())
            self.breaker.failed()
            self._free_slot()
            raise
        except Overloaded as exc:  # alive, but busy: counts against health, not the breaker
            self.health.failed(exc.message, time.time())
            self.breaker.settled()
            self._free_slot()
            raise
        except InvalidRequest:
            self.health.ok(time.time())  # it answered: the request was the client's mistake
            self.breaker.succeeded()
            self._free_slot()
            raise
        except BaseException:
            self.breaker.settled()
            self._free_slot()
            raise
        self.health.ok(time.time())
        self.breaker.succeeded()
        return response

    def broke(self, message: str) -> None:
        """A response that started well failed later (cut mid-stream, a bad body)."""
        self.health.broke(message, time.time())
        self.breaker.failed()

    def describe(self) -> dict[str, Any]:
        """Name, kind, URL, limits and health, for ``/admin/overview`` (never the key)."""
        s = self.spec
        return {
            "name": s.name,
            "kind": s.kind,
            "base_url": s.base_url,
            "max_concurrency": s.max_concurrency,
            "timeout_s": s.timeout_s,
            "breaker": self.breaker.current,
            "waiting": self.waiting,
            **self.health.to_dict(),
        }

    @property
    def waiting(self) -> int:
        """Requests waiting for one of its ``max_concurrency`` slots."""
        return 0 if self._slots is None else self._slots.waiting

    async def release(self, response: httpx.Response) -> None:
        """Close ``response`` (an unread stream tells the upstream to stop) and free its slot."""
        try:
            await response.aclose()
        finally:
            self._free_slot()

    def failure(self, exc: httpx.HTTPError) -> MlxdError:
        """The error for a transport failure: a timeout or a broken connection."""
        if isinstance(exc, httpx.TimeoutException):
            return UpstreamTimeout(
                f"backend {self.name!r} sent nothing within {self.spec.timeout_s:g}s"
            )
        what = type(exc).__name__
        return UpstreamError(f"backend {self.name!r} failed: {what}: {self.redact(str(exc))}")

    def redact(self, text: str) -> str:
        """``text`` with the backend's key replaced by ``[redacted]``."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    # Internal helpers

    async def _send(self, path: str, body: Mapping[str, Any], request_id: str) -> httpx.Response:
        """``send`` without the slot: every failure as an ``MlxdError``."""
        try:
            request = self._client.build_request(
                "POST", path, json=body, headers={"X-Request-Id": request_id}
            )
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self.failure(exc) from None
        if response.status_code >= 300:
            await self._refuse(response)
        return response

    def _free_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    async def _refuse(self, response: httpx.Response) -> None:
        try:
            await response.aread()
        finally:
            await response.aclose()
        status = response.status_code
        message, param = self._upstream_message(response)
        if status in _PASSED_THROUGH:
            raise InvalidRequest(message, param=param)
        if status == 429:
            retry_after = _retry_after(response.headers.get("retry-after"))
            raise Overloaded(
                f"backend {self.name!r} is rate limiting: {message}", retry_after=retry_after
            )
        if status in (401, 403):
            raise UpstreamError(f"backend {self.name!r} refused our credentials (HTTP {status})")
        raise UpstreamError(f"backend {self.name!r} answered HTTP {status}: {message}")

    def _upstream_message(self, response: httpx.Response) -> tuple[str, str | None]:
        try:
            error = json.loads(response.content)["error"]
            message, param = str(error.get("message", "")), error.get("param")
        except (ValueError, KeyError, TypeError, AttributeError):
            message, param = response.text[:200], None
        param = param if isinstance(param, str) else None
        return self.redact(message or response.reason_phrase), param


def _auth_headers(kind: str, api_key: str | None) -> dict[str, str]:
    if api_key is None:
        return {}
    if kind == "anthropic":
        return {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {api_key}"}


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        return 1.0
    return max(1.0, math.ceil(seconds)) if math.isfinite(seconds) else 1.0
