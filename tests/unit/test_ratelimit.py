"""RateLimiter: per-key token buckets for requests and tokens per minute, on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxd.gateway.http.ratelimit import RateLimiter, TokenBucket, retry_after


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> RateLimiter:
    return RateLimiter(clock)


def test_no_limits_admit_everything(limiter: RateLimiter) -> None:
    for _ in range(1000):
        assert limiter.admit("k", None, None) == 0.0
    limiter.charge("k", 10**9, None)
    assert limiter.admit("k", None, None) == 0.0


def test_rpm_allows_a_burst_of_the_limit_then_waits(limiter: RateLimiter) -> None:
    assert [limiter.admit("k", 3, None) for _ in range(3)] == [0.0, 0.0, 0.0]
    # One request flows back every 60 / 3 = 20 s.
    assert limiter.admit("k", 3, None) == pytest.approx(20.0)


def test_rpm_refills_with_time(limiter: RateLimiter, clock: Clock) -> None:
    for _ in range(2):
        limiter.admit("k", 2, None)
    clock.now += 29.0
    assert limiter.admit("k", 2, None) == pytest.approx(1.0)
    clock.now += 1.0
    assert limiter.admit("k", 2, None) == 0.0
    assert limiter.admit("k", 2, None) > 0


def test_refused_requests_are_not_counted(limiter: RateLimiter, clock: Clock) -> None:
    limiter.admit("k", 1, None)
    for _ in range(5):
        assert limiter.admit("k", 1, None) > 0
    clock.now += 60.0
    assert limiter.admit("k", 1, None) == 0.0


def test_keys_are_limited_apart(limiter: RateLimiter) -> None:
    assert limiter.admit("a", 1, None) == 0.0
    assert limiter.admit("a", 1, None) > 0
    assert limiter.admit("b", 1, None) == 0.0


def test_tpm_admits_until_the_tokens_are_used_up(limiter: RateLimiter) -> None:
    assert limiter.admit("k", None, 100) == 0.0
    limiter.charge("k", 60, 100)
    assert limiter.admit("k", None, 100) == 0.0  # 40 tokens left: one more request may start
    limiter.charge("k", 40, 100)
    assert limiter.admit("k", None, 100) > 0


def test_tpm_debt_is_repaid_over_time(limiter: RateLimiter, clock: Clock) -> None:
    limiter.charge("k", 150, 100)  # 50 over: repaid at 100 / 60 per second = 30 s
    wait = limiter.admit("k", None, 100)
    assert wait == pytest.approx(30.0)
    clock.now += retry_after(wait)
    assert limiter.admit("k", None, 100) == 0.0


def test_both_limits_must_allow_and_the_longer_wait_wins(limiter: RateLimiter) -> None:
    assert limiter.admit("k", 60, 60) == 0.0
    limiter.charge("k", 90, 60)  # 30 tokens of debt: 30 s; requests are fine
    assert limiter.admit("k", 60, 60) == pytest.approx(30.0)


def test_a_clock_going_back_adds_nothing() -> None:
    bucket = TokenBucket.full(10.0, now=100.0)
    bucket.take(10.0, now=100.0)
    bucket.refill(now=50.0)
    assert bucket.level == 0.0


@pytest.mark.parametrize("wait, header", [(0.0001, 1), (0.999, 1), (1.0, 2), (29.5, 30)])
def test_retry_after_is_a_whole_second_past_the_wait(wait: float, header: int) -> None:
    assert retry_after(wait) == header


@given(
    rpm=st.integers(1, 600),
    steps=st.lists(st.floats(0.0, 30.0, allow_nan=False), min_size=1, max_size=60),
)
def test_retry_after_is_never_too_early(rpm: int, steps: list[float]) -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    for step in steps:
        clock.now += step
        wait = limiter.admit("k", rpm, None)
        if wait:
            clock.now += retry_after(wait)
            assert limiter.admit("k", rpm, None) == 0.0
