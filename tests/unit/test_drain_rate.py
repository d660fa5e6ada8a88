"""The 429's Retry-After from the waiting queue's measured drain rate
(worker/sched/drain_rate.py)."""

from __future__ import annotations

import pytest

from mlxd.worker.sched.drain_rate import MAX_S, MIN_S, WINDOW_S, DrainRate


def test_retry_after_is_the_queue_ahead_over_the_measured_rate() -> None:
    drain = DrainRate()
    for t in (0.0, 2.0, 4.0, 6.0, 8.0):  # 5 departures over 8 s
        drain.observe(t)
    assert drain.rate(8.0) == pytest.approx(5 / 8)
    assert drain.retry_after(num_waiting=4, now=8.0) == pytest.approx(5 / (5 / 8))


@pytest.mark.parametrize(("num_waiting", "expected"), [(0, MIN_S), (10_000, MAX_S)])
def test_retry_after_is_clamped(num_waiting: int, expected: float) -> None:
    drain = DrainRate()
    for i in range(20):
        drain.observe(i * 0.1)  # 20 departures in 2 s: 10/s
    assert drain.retry_after(num_waiting, now=2.0) == expected


def test_a_queue_that_has_not_moved_within_the_window_says_the_maximum() -> None:
    drain = DrainRate()
    assert drain.retry_after(3, now=0.0) == MAX_S  # nothing measured yet
    drain.observe(0.0)
    assert drain.retry_after(3, now=WINDOW_S + 1) == MAX_S  # its one departure is too old
