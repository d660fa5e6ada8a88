"""What both proxies share to relay one upstream response: its once-only finisher, the SSE
response that releases it however the client leaves, and the readers of upstream SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxd.errors import RequestTimeout, UpstreamError, UpstreamTimeout
from mlxd.gateway.backends.remote.metrics import BackendMetrics
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.http.accesslog import record_of
from mlxd.gateway.routing.router import Target
from mlxd.gateway.surfaces.openai.schemas import priority_of

log = logging.getLogger(__name__)

BACKEND_HEADER = "X-Mlxd-Backend"
Done = Callable[[str], Awaitable[None]]
# Outcomes of a started response that are the backend's fault (not the client leaving, not
# our own deadline).
_BACKEND_FAULTS = {UpstreamError.code, UpstreamTimeout.code}


def finisher(
    backend_metrics: BackendMetrics,
    backend: RemoteBackend,
    target: Target,
    response: httpx.Response,
    started: float,
) -> Done:
    """The once-only ``done(outcome)`` of one upstream response: counts it, closes it."""
    gauge = backend_metrics.in_flight.labels(backend.name)
    gauge.inc()
    finished = False

    async def done(outcome: str) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        gauge.dec()
        if outcome in _BACKEND_FAULTS:
            backend.broke(f"the response broke off ({outcome})")
        seconds = time.perf_counter() - started if outcome == "ok" else None
        backend_metrics.done(backend.name, target.name, outcome, seconds)
        await backend.release(response)

    return done


def take_priority(request: Request, doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The request's priority (its ``priority`` field, ``X-Priority``, the key's tier) and
    ``doc`` without that field: the gateway queues by it for the backend's slots, and a cloud
    API would refuse a field it does not know."""
    record = record_of(request)
    tier = None if record.key is None else record.key.tier
    priority = priority_of(doc, request.headers.get("x-priority"), tier)
    return priority, {k: v for k, v in doc.items() if k != "priority"}


async def read_json(
    backend: RemoteBackend,
    response: httpx.Response,
    timeout_s: float,
    done: Done,
    reshape: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """A non-streamed upstream answer as a JSON object, reshaped for the client's API; every
    way it can fail becomes the typed error the client gets, and ``done`` counts it."""
    outcome = "ok"
    try:
        async with asyncio.timeout(timeout_s):
            payload = json.loads(await response.aread())
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
        return reshape(payload)
    except TimeoutError:
        outcome = RequestTimeout.code
        raise RequestTimeout("The request did not finish in time") from None
    except httpx.HTTPError as exc:
        error = backend.failure(exc)
        outcome = error.code
        raise error from None
    except ValueError:
        outcome = UpstreamError.code
        raise UpstreamError(f"backend {backend.name!r} answered with bad JSON") from None
    finally:
        await done(outcome)


class RelayResponse(StreamingResponse):
    """An SSE response that releases the upstream stream however it ends (client gone too)."""

    media_type = "text/event-stream"

    def __init__(
        self, frames: AsyncGenerator[bytes, None], done: Done, headers: Mapping[str, str]
    ) -> None:
        self._frames = frames
        self._done = done
        sse_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
        super().__init__(frames, headers=sse_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            log.info("client of a remote stream disconnected")
        finally:
            with anyio.CancelScope(shield=True):
                await self._frames.aclose()  # never started, or stopped by a gone client
                await self._done("client_closed")


async def read_sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event of ``response`` (names, comments, ids skipped)."""
    async for _, data in read_sse(response):
        yield data


async def read_sse(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """Each server-sent event of ``response`` as (event name, data)."""
    name, lines = "message", []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            lines.append(line[6:] if line.startswith("data: ") else line[5:])
        elif not line and lines:
            yield name, "\n".join(lines)
            name, lines = "message", []
    if lines:
        yield name, "\n".join(lines)
