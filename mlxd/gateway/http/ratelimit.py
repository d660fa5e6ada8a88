"""Per-key request and token limits: one token bucket per key and unit, refilled continuously.

A bucket holds up to a minute's allowance and refills at ``limit / 60`` per second, so a client
may burst its whole minute at once and then gets a steady trickle. Tokens are only known when a
request finishes, so they are charged afterwards and may drive the bucket negative: the key's
next request then waits until the debt is repaid. Pure Python with an injected clock; everything
runs on the gateway's event loop, so there are no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
_EPSILON = 1e-9  # "a positive balance": the smallest level that admits a request


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` units refilled at ``capacity / WINDOW_S`` per second; the level may go negative.

    ``capacity`` is a minute's allowance, ``level`` what is left now (below zero: a debt), and
    ``updated`` the clock reading of the last refill.
    """

    capacity: float
    level: float
    updated: float

    @classmethod
    def full(cls, capacity: float, now: float) -> TokenBucket:
        """A bucket holding its whole ``capacity`` at clock reading ``now``."""
        return cls(capacity=capacity, level=capacity, updated=now)

    def refill(self, now: float) -> None:
        """Add what flowed in since the last update, up to ``capacity``."""
        elapsed = max(0.0, now - self.updated)
        self.level = min(self.capacity, self.level + elapsed * self.capacity / WINDOW_S)
        self.updated = now

    def wait_s(self, need: float, now: float) -> float:
        """Seconds until the level reaches ``need`` (0.0 if it already has)."""
        self.refill(now)
        missing = need - self.level
        return 0.0 if missing <= 0 else missing * WINDOW_S / self.capacity

    def take(self, amount: float, now: float) -> None:
        """Remove ``amount`` units, even below zero (a debt repaid by later refills)."""
        self.refill(now)
        self.level -= amount


class RateLimiter:
    """Requests-per-minute and tokens-per-minute limits, keyed by API key name.

    Args:
        clock: seconds as a float, monotonic; tests inject their own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def admit(self, name: str, rpm: int | None, tpm: int | None) -> float:
        """Count one request for ``name`` if its limits allow it.

        Args:
            name: the key's name.
            rpm: requests per minute, or ``None`` for no limit.
            tpm: tokens per minute, or ``None`` for no limit.

        Returns:
            0.0 if the request was admitted (and counted), else the seconds to wait.
        """
        now = self._clock()
        requests = self._bucket(self._requests, name, rpm, now)
        tokens = self._bucket(self._tokens, name, tpm, now)
        # Tokens are charged after the fact: any positive balance admits one more request.
        wait = max(
            0.0 if requests is None else requests.wait_s(1.0, now),
            0.0 if tokens is None else tokens.wait_s(_EPSILON, now),
        )
        if wait == 0.0 and requests is not None:
            requests.take(1.0, now)
        return wait

    def charge(self, name: str, num_tokens: int, tpm: int | None) -> None:
        """Record ``num_tokens`` (prompt + completion) used by a finished request of ``name``."""
        now = self._clock()
        tokens = self._bucket(self._tokens, name, tpm, now)
        if tokens is not None and num_tokens > 0:
            tokens.take(float(num_tokens), now)

    # Internal helpers

    def _bucket(
        self, buckets: dict[str, TokenBucket], name: str, limit: int | None, now: float
    ) -> TokenBucket | None:
        if limit is None:
            return None
        bucket = buckets.get(name)
        if bucket is None:
            bucket = buckets[name] = TokenBucket.full(float(limit), now)
        return bucket


def retry_after(wait_s: float) -> int:
    """The ``Retry-After`` value for a wait: whole seconds, >= 1, never earlier than ``wait_s``."""
    return int(wait_s) + 1
