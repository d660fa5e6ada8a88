"""How fast the waiting queue empties, measured, and the ``Retry-After`` that follows from it.

A client refused with 429 should come back when a slot is likely free, not after a constant
second: with a queue of 64 that drains 2 requests a second, retrying every second only adds
load. The rate is the departures (admitted or cancelled) over the last ``WINDOW_S`` seconds::

    rate        = departures in the window / max(1 s, now - the oldest of them)
    retry_after = clamp((num_waiting + 1) / rate, MIN_S, MAX_S)

the time for everyone ahead, and this request, to leave the queue at the measured pace. With no
departure in the window (nothing has moved for ``WINDOW_S``), the answer is ``MAX_S``.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 30.0
MIN_S = 1.0  # HTTP Retry-After counts whole seconds; 0 would invite an instant retry storm
MAX_S = 60.0  # beyond a minute a client should rather hear "overloaded" again than wait blind


class DrainRate:
    """Departure times from one queue over a sliding window; pure Python, the caller's clock."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._times: deque[float] = deque()

    def observe(self, now: float) -> None:
        """One request left the queue at ``now`` (monotonic seconds)."""
        self._times.append(now)
        self._forget(now)

    def rate(self, now: float) -> float:
        """Departures per second over the window; 0.0 when none."""
        self._forget(now)
        if not self._times:
            return 0.0
        return len(self._times) / max(1.0, now - self._times[0])

    def retry_after(self, num_waiting: int, now: float) -> float:
        """Seconds until a request arriving now would likely leave the queue (module formula)."""
        rate = self.rate(now)
        if rate <= 0.0:
            return MAX_S
        return min(MAX_S, max(MIN_S, (num_waiting + 1) / rate))

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()
