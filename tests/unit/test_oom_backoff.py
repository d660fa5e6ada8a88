"""``max_num_seqs`` comes back after out-of-memory errors: doubling after a run of clean steps,
up to the limit before the first failure; a raise that fails soon waits longer; a limit set by
hand ends it."""

from __future__ import annotations

import pytest

from mlxd.worker.sched import oom_backoff
from mlxd.worker.sched.oom_backoff import OomBackoff


@pytest.fixture(autouse=True)
def _short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom_backoff, "RECOVER_STEPS", 3)


def steps(b: OomBackoff, current: int, n: int) -> list[int | None]:
    return [b.on_step(current) for _ in range(n)]


def test_the_limit_doubles_after_clean_steps_up_to_the_first_one() -> None:
    b = OomBackoff()
    b.on_oom(64, 32)
    b.on_oom(32, 16)  # the same burst: still back to 64 in the end
    assert steps(b, 16, 3) == [None, None, 32]
    assert steps(b, 32, 3) == [None, None, 64]
    assert steps(b, 64, 5) == [None] * 5


def test_a_raise_that_fails_soon_waits_twice_as_long() -> None:
    b = OomBackoff()
    b.on_oom(8, 4)
    assert steps(b, 4, 3)[-1] == 8
    b.on_oom(8, 4)  # the raise did not fit
    assert b.wait == 6 and steps(b, 4, 6)[-1] == 8


def test_a_long_clean_run_at_the_limit_forgets_the_longer_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(oom_backoff, "MAX_WAIT", 12)
    b = OomBackoff()
    b.on_oom(8, 4)
    assert steps(b, 4, 3)[-1] == 8
    b.on_oom(8, 4)  # the raise failed soon: 6 steps next time
    assert steps(b, 4, 6)[-1] == 8 and b.wait == 6
    steps(b, 8, 12)  # clean for MAX_WAIT steps at the limit
    b.on_oom(8, 4)
    assert b.wait == 3


def test_a_limit_set_by_hand_ends_the_backoff() -> None:
    b = OomBackoff()
    b.on_oom(8, 4)
    assert steps(b, 2, 10) == [None] * 10  # `mlxd worker set max_num_seqs 2`
    assert b.target is None
    b.on_oom(2, 1)  # a later failure starts from the user's limit
    assert steps(b, 1, 3)[-1] == 2 and steps(b, 2, 5) == [None] * 5


def test_nothing_happens_without_a_failure() -> None:
    assert steps(OomBackoff(), 16, 10) == [None] * 10
