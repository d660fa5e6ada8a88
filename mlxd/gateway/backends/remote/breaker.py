"""A circuit breaker per remote backend: after ``failures`` failures in a row the gateway stops
sending to it (its requests fail over at once, or fail fast) for ``cooldown_s``; then one
request goes through as a probe: if it works the backend is back, if not it waits again.
A failing cloud API then costs clients no timeout each, and it is not hammered while down."""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
STATES = (CLOSED, HALF_OPEN, OPEN)  # the /metrics gauge's values: their index


class Breaker:
    def __init__(
        self,
        failures: int = 5,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.state = CLOSED
        self._in_a_row = 0
        self._opened_at = 0.0
        self._probing = False

    def allow(self) -> bool:
        """Whether a request may go now (``False``: open, or a probe is already out)."""
        if self.state == OPEN and self.clock() - self._opened_at >= self.cooldown_s:
            self.state = HALF_OPEN
        if self.state == CLOSED:
            return True
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    @property
    def current(self) -> str:
        """The state as of now (open turns half-open once the cooldown is over)."""
        if self.state == OPEN and self.clock() - self._opened_at >= self.cooldown_s:
            return HALF_OPEN
        return self.state

    def retry_in(self) -> float:
        """Seconds until the next probe may go (0 when one may go now)."""
        return max(0.0, self._opened_at + self.cooldown_s - self.clock())

    def succeeded(self) -> None:
        self.state, self._in_a_row, self._probing = CLOSED, 0, False

    def failed(self) -> None:
        self._in_a_row += 1
        if self.state == HALF_OPEN or self._in_a_row >= self.failures:
            self.state, self._opened_at, self._probing = OPEN, self.clock(), False

    def settled(self) -> None:
        """A request let through ended neither way (the client left, a 400): a probe may go
        again."""
        self._probing = False
