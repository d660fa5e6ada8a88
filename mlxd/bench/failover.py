"""The failover scenario: streams run back to back against a model with fallbacks while its
backend is killed mid-run; what each request went through says how the daemon failed over.

A request counts as **lost** when it failed before its first token: that is what failover must
prevent (target 0). One that failed after streaming had begun was **cut**: its backend died under
it, and mlxd never switches a stream silently, so those end with an error event. **Time to fail
over** runs from the kill to the first token a fallback sent; **gap** from the kill to the first
token of a request started after it, from any model (service resumed).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPT = "Count from one to twenty, one number per line."


@dataclass
class Attempt:
    """One streamed chat request: when it started, got its first token, ended, and how."""

    started: float
    first_token: float | None = None
    ended: float = 0.0
    status: int = 0
    backend: str = ""  # the X-Mlxd-Backend header: "local" or a backend's name
    model: str = ""  # the model that answered (a fallback's name after failover)
    error: str | None = None

    @property
    def outcome(self) -> str:
        if self.error is None:
            return "ok"
        return "cut" if self.first_token is not None else "lost"


@dataclass
class FailoverReport:
    primary: str
    killed_at: float
    attempts: list[Attempt] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The figures: counts by outcome and by serving model, time to fail over, the gap."""
        outcomes = Counter(a.outcome for a in self.attempts)
        served = Counter(a.model for a in self.attempts if a.outcome == "ok")
        after = [a for a in self.attempts if a.started >= self.killed_at and a.first_token]
        resumed = min((a.first_token for a in after if a.first_token), default=None)
        fallback = min(
            (a.first_token for a in after if a.first_token and a.model != self.primary),
            default=None,
        )
        lost = [a.error for a in self.attempts if a.outcome == "lost"]
        return {
            "requests": len(self.attempts),
            "ok": outcomes["ok"],
            "lost": outcomes["lost"],
            "cut": outcomes["cut"],
            "served_by": dict(served),
            "failover_s": None if fallback is None else round(fallback - self.killed_at, 3),
            "gap_s": None if resumed is None else round(resumed - self.killed_at, 3),
            "lost_errors": sorted(set(e for e in lost if e))[:5],
        }


async def run_failover(
    url: str,
    model: str,
    kill: Callable[[], None],
    *,
    concurrency: int = 8,
    duration_s: float = 12.0,
    kill_after_s: float = 4.0,
    max_tokens: int = 32,
    api_key: str | None = None,
    on_progress: Callable[[str], None] = lambda line: None,
) -> FailoverReport:
    """``concurrency`` clients stream chat requests to ``model`` back to back for
    ``duration_s``; ``kill()`` runs ``kill_after_s`` in."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.perf_counter()
    report = FailoverReport(model, killed_at=start + kill_after_s)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
    }
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:

        async def loop() -> None:
            while time.perf_counter() < start + duration_s:
                report.attempts.append(attempt := Attempt(time.perf_counter()))
                await _stream(client, body, attempt)

        async def killer() -> None:
            await asyncio.sleep(kill_after_s)
            report.killed_at = time.perf_counter()
            kill()
            on_progress(f"killed the primary at {kill_after_s:.1f}s")

        await asyncio.gather(killer(), *(loop() for _ in range(concurrency)))
    return report


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], attempt: Attempt) -> None:
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            attempt.status = response.status_code
            attempt.backend = response.headers.get("x-mlxd-backend", "")
            if response.status_code != 200:
                attempt.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return
            async for line in response.aiter_lines():
                _event(line, attempt)
    except httpx.HTTPError as exc:
        attempt.error = f"{type(exc).__name__}: {exc}"
    finally:
        attempt.ended = time.perf_counter()


def _event(line: str, attempt: Attempt) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[6:])
    if "error" in chunk:
        attempt.error = str(chunk["error"].get("message", chunk["error"]))
        return
    attempt.model = chunk.get("model", attempt.model)
    if attempt.first_token is None and any(
        (c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()
    ):
        attempt.first_token = time.perf_counter()


def kill_process(pid: int) -> Callable[[], None]:
    """A ``kill`` that sends SIGKILL to ``pid`` (the primary's daemon or worker process)."""
    return lambda: os.kill(pid, signal.SIGKILL)


def worker_pid(url: str, model: str, api_key: str | None = None) -> int:
    """The pid of ``model``'s local worker, from the daemon's ``/admin/overview``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    overview = httpx.get(f"{url}/admin/overview", headers=headers, timeout=10).json()
    for row in overview.get("models", []):
        if row.get("name") == model and row.get("pid"):
            return int(row["pid"])
    raise ValueError(f"no running local worker for {model!r} at {url}")
