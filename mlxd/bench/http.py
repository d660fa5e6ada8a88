"""`mlxd bench run`'s client: sessions of requests against any OpenAI-compatible server.

``/v1/completions`` or ``/v1/chat/completions``, streamed (SSE) or not. Each request's timing is
taken as the client sees it: TTFT at the first chunk with text, one inter-token gap per chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from mlxd.bench.sse_client import SSEPool
from mlxd.bench.stats import RequestTiming
from mlxd.bench.workload import Prompt, Request, Session

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Target:
    """Where and how requests go.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        endpoint: ``completions`` or ``chat``.
        stream: SSE streaming; without it TTFT is the whole response time.
        timeout_s: per request.
        api_key: sent as ``Authorization: Bearer``.
        extra_body: merged into every request body (e.g. mlxd's ``{"speculate": false}``).
    """

    base_url: str
    endpoint: str = "completions"
    stream: bool = True
    timeout_s: float = 600.0
    api_key: str | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ENDPOINTS[self.endpoint]


def check_reachable(target: Target) -> str | None:
    """None if ``GET /v1/models`` answers at all; else a one-line reason."""
    try:
        httpx.get(target.base_url.rstrip("/") + "/v1/models", timeout=10, headers=_auth(target))
    except httpx.HTTPError as exc:
        return f"cannot reach {target.base_url}: {exc}"
    return None


def served_models(target: Target) -> list[str]:
    """The model names ``GET /v1/models`` lists; ``httpx.HTTPError`` if it does not answer 200."""
    r = httpx.get(target.base_url.rstrip("/") + "/v1/models", timeout=10, headers=_auth(target))
    r.raise_for_status()
    return [str(m["id"]) for m in r.json()["data"]]


async def run_sessions(
    target: Target,
    concurrency: int,
    sessions: list[Session],
    on_done: Callable[[RequestTiming], None] | None = None,
) -> list[RequestTiming]:
    """Run ``sessions``, ``concurrency`` at a time; every request's timing, in session order."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    # Streams over plain http go through the lean client (sse_client.py), the rest through httpx.
    lean = SSEPool(target.base_url) if target.stream and _is_http(target) else None
    async with httpx.AsyncClient(
        timeout=target.timeout_s, limits=limits, headers=_auth(target)
    ) as client:
        t0 = time.perf_counter()

        async def go(session: Session) -> list[RequestTiming]:
            async with sem:
                return await _session(_Clients(client, lean), target, session, t0, on_done)

        try:
            per_session = await asyncio.gather(*(go(s) for s in sessions))
        finally:
            if lean is not None:
                lean.close()
    return [t for ts in per_session for t in ts]


# Internal helpers


@dataclass(frozen=True)
class _Clients:
    httpx: httpx.AsyncClient
    lean: SSEPool | None  # streams over plain http


def _is_http(target: Target) -> bool:
    return target.base_url.startswith("http://")


async def _session(
    client: _Clients,
    target: Target,
    session: Session,
    t0: float,
    on_done: Callable[[RequestTiming], None] | None,
) -> list[RequestTiming]:
    history: list[tuple[Prompt, str]] = []
    out = []
    for req in session.turns:
        timing, text = await _one(client, target, _body(target, req, history), req, t0)
        out.append(timing)
        if on_done is not None:
            on_done(timing)
        if timing.error is not None:
            break  # a conversation cannot go on without its last reply
        if session.carry_history:
            history.append((req.user, text))
    return out


async def _one(
    client: _Clients, target: Target, body: dict[str, Any], req: Request, t0: float
) -> tuple[RequestTiming, str]:
    timing = RequestTiming(start=time.perf_counter() - t0, group=req.group)
    parts: list[str] = []
    try:
        if client.lean is not None:
            await _one_lean(client.lean, target, body, req, timing, parts, t0)
        else:
            await _one_httpx(client.httpx, target, body, req, timing, parts, t0)
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"[:120]
    timing.end = time.perf_counter() - t0
    if timing.output_tokens == 0:
        timing.output_tokens = len(timing.token_times)  # no usage sent: count text chunks
    return timing, "".join(parts)


async def _one_lean(
    pool: SSEPool,
    target: Target,
    body: dict[str, Any],
    req: Request,
    timing: RequestTiming,
    parts: list[str],
    t0: float,
) -> None:
    path = urlsplit(target.url).path
    headers = {**_auth(target), **req.headers}
    async with asyncio.timeout(target.timeout_s):
        status, raw = await pool.post(
            path, body, headers, lambda data: _on_data(data, timing, parts, t0)
        )
    if status != 200:
        timing.error = _http_error(status, raw)


async def _one_httpx(
    client: httpx.AsyncClient,
    target: Target,
    body: dict[str, Any],
    req: Request,
    timing: RequestTiming,
    parts: list[str],
    t0: float,
) -> None:
    async with client.stream("POST", target.url, json=body, headers=req.headers) as resp:
        if resp.status_code != 200:
            timing.error = _http_error(resp.status_code, await resp.aread())
        elif target.stream:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    _on_data(line[6:], timing, parts, t0)
        else:
            _on_body(json.loads(await resp.aread()), timing, parts, t0)


def _body(target: Target, req: Request, history: list[tuple[Prompt, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": req.model,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": req.ignore_eos,
        "stream": target.stream,
    }
    body.update(target.extra_body)
    if target.stream:
        body["stream_options"] = {"include_usage": True}
    if target.endpoint == "chat":
        messages = [{"role": "system", "content": req.prefix}] if req.prefix else []
        for user, reply in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        body["messages"] = [*messages, {"role": "user", "content": _content(req)}]
    else:
        body["prompt"] = _concat([req.prefix, *(p for turn in history for p in turn), req.user])
    return body


def _content(req: Request) -> Prompt | list[dict[str, Any]]:
    """The last user message's content: its text, after its image where it has one."""
    if req.image is None:
        return req.user
    image = {"type": "image_url", "image_url": {"url": req.image}}
    return [image, {"type": "text", "text": req.user}]


def _concat(parts: list[Prompt | None]) -> Prompt:
    present = [p for p in parts if p]
    ids = [p for p in present if isinstance(p, list)]
    if len(ids) == len(present):
        return [t for p in ids for t in p]
    return "\n".join(p for p in present if isinstance(p, str))


def _on_data(data: str | bytes, timing: RequestTiming, parts: list[str], t0: float) -> None:
    """One SSE ``data:`` payload: a JSON chunk, or ``[DONE]``."""
    if isinstance(data, bytes):
        data = data.decode()  # json.loads would sniff the encoding of bytes first
    if data == "[DONE]":
        return
    chunk = json.loads(data)
    if "error" in chunk:
        timing.error = str(chunk["error"].get("message", chunk["error"]))[:120]
        return
    if chunk.get("usage"):
        _usage(chunk["usage"], timing)
    text = _text(chunk, "delta")
    if text:
        now = time.perf_counter() - t0
        timing.first_token = timing.first_token if timing.first_token is not None else now
        timing.token_times.append(now)
        parts.append(text)


def _on_body(body: dict[str, Any], timing: RequestTiming, parts: list[str], t0: float) -> None:
    timing.first_token = time.perf_counter() - t0  # the whole answer arrives at once
    _usage(body.get("usage") or {}, timing)
    parts.append(_text(body, "message"))


def _usage(usage: dict[str, Any], timing: RequestTiming) -> None:
    timing.output_tokens = usage.get("completion_tokens", 0)
    timing.prompt_tokens = usage.get("prompt_tokens", 0)
    timing.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _text(chunk: dict[str, Any], key: str) -> str:
    choices = chunk.get("choices") or [{}]
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or ""
    return (choice.get(key) or {}).get("content") or ""


def _http_error(status: int, raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode(errors="replace")
    return f"HTTP {status}: {message}"[:120]


def _auth(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
