"""What the status page, ``mlxd ps`` and ``/admin/overview`` show of a remote backend: how its
last requests went, so a failing cloud API is visible before a client complains. Never its key:
errors are the redacted messages clients get."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class BackendHealth:
    """A backend's request outcomes, counted where the request is sent (``RemoteBackend.send``)
    and again if its body fails after that (``relay.finisher``): a failure is one the backend
    caused (unreachable, 5xx, timeout, our key refused, 429, a broken stream); a request it
    refused as malformed (400) still shows it answering."""

    requests: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_ok_at: float | None = None

    @property
    def state(self) -> str:
        """``unused`` (no request yet), ``ok`` or ``failing`` (the last request failed)."""
        if not self.requests:
            return "unused"
        return "failing" if self.consecutive_failures else "ok"

    def ok(self, now: float) -> None:
        self.requests += 1
        self.consecutive_failures = 0
        self.last_ok_at = now

    def failed(self, message: str, now: float) -> None:
        self.requests += 1
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error, self.last_error_at = message, now

    def broke(self, message: str, now: float) -> None:
        """A request counted ``ok`` when its headers came failed later (a stream cut mid-way,
        a body that never finished or was not JSON): a failure after all."""
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error, self.last_error_at = message, now

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "requests": self.requests,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_ok_at": self.last_ok_at,
        }
