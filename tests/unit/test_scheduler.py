from __future__ import annotations

import pytest

from mlxd.config import SchedulerConfig
from mlxd.errors import Overloaded
from mlxd.protocol.messages import SamplingParams
from mlxd.worker.scheduler import Scheduler
from mlxd.worker.sequence import PRIORITY_LEVELS, Sequence, SequenceStatus


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_seq(rid: str, n_prompt: int = 4, priority: str = "normal", at: float = 0.0) -> Sequence:
    return Sequence(
        request_id=rid, client=b"c", prompt_ids=list(range(n_prompt)), sampling=SamplingParams(),
        max_tokens=8, priority=PRIORITY_LEVELS[priority], arrival=at,
    )  # fmt: skip


@pytest.fixture
def clock() -> Clock:
    return Clock()


def sched(clock: Clock, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(**kw), clock=clock)  # type: ignore[arg-type]


def run_prefill(s: Scheduler) -> list[str]:
    chunks = s.schedule_prefill()
    for c in chunks:
        s.complete_chunk(c)
    return [c.seq.request_id for c in chunks]


def test_queue_limit_raises_overloaded(clock: Clock) -> None:
    s = sched(clock, max_queued=2)
    s.add(make_seq("a"))
    s.add(make_seq("b"))
    with pytest.raises(Overloaded):
        s.add(make_seq("c"))


def test_admission_respects_max_num_seqs(clock: Clock) -> None:
    s = sched(clock, max_num_seqs=2)
    for rid in "abc":
        s.add(make_seq(rid))
    assert run_prefill(s) == ["a", "b"]
    assert [q.request_id for q in s.running] == ["a", "b"]
    assert run_prefill(s) == []
    s.finish(s.running[0], "stop")
    assert run_prefill(s) == ["c"]


def test_long_prompt_is_chunked_and_others_wait_for_budget(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    s.add(make_seq("long", n_prompt=40))
    s.add(make_seq("short", n_prompt=4))
    spans = []
    for _ in range(4):
        chunks = s.schedule_prefill()
        spans.append([(c.seq.request_id, c.start, c.end) for c in chunks])
        for c in chunks:
            s.complete_chunk(c)
    assert spans[0] == [("long", 0, 16)]
    assert spans[1] == [("long", 16, 32)]
    assert spans[2] == [("long", 32, 40), ("short", 0, 4)]
    assert spans[3] == []
    assert all(q.status is SequenceStatus.RUNNING for q in s.running)


def test_higher_priority_is_admitted_first(clock: Clock) -> None:
    s = sched(clock, max_num_seqs=1)
    s.add(make_seq("low", priority="low"))
    s.add(make_seq("normal"))
    s.add(make_seq("high", priority="high"))
    assert run_prefill(s) == ["high"]


def test_aging_lets_a_low_priority_request_overtake(clock: Clock) -> None:
    s = sched(clock, max_num_seqs=1, aging_s=1.0)
    s.add(make_seq("old-low", priority="low", at=0.0))
    clock.now = 2.5
    s.add(make_seq("new-high", priority="high", at=2.5))
    # old-low: 2 - 2.5 = -0.5; new-high: 0 - 0 = 0
    assert run_prefill(s) == ["old-low"]


def test_cancel_by_finish_removes_from_every_queue(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    s.add(make_seq("a", n_prompt=40))
    s.schedule_prefill()
    seq = s.find("a", b"c")
    assert seq is not None and seq in s.prefilling
    s.finish(seq, "cancelled")
    assert not s.has_work() and seq.finish_reason == "cancelled"
    assert s.find("a", b"c") is None


def test_expired_lists_sequences_past_their_deadline(clock: Clock) -> None:
    s = sched(clock)
    seq = make_seq("a")
    seq.deadline = 5.0
    s.add(seq)
    assert s.expired() == []
    clock.now = 5.0
    assert s.expired() == [seq]


def test_update_config_validates() -> None:
    s = Scheduler(SchedulerConfig())
    s.update_config(max_num_seqs=3)
    assert s.config.max_num_seqs == 3
    with pytest.raises(Exception, match="max-num-seqs"):
        s.update_config(max_num_seqs=0)


def test_overloaded_retry_after_follows_the_queue_drain_rate(clock: Clock) -> None:
    s = sched(clock, max_queued=3, max_num_seqs=1)
    for rid in "abcd":
        s.add(make_seq(rid))
        if rid == "a":
            run_prefill(s)  # admitted at t=0
    for t in (4.0, 8.0):  # one admission every 4 s
        clock.now = t
        s.finish(s.running[0], "stop")
        run_prefill(s)
        s.add(make_seq(f"late{t}"))
    with pytest.raises(Overloaded) as info:
        s.add(make_seq("e"))
    # 3 departures over 8 s; 3 waiting ahead + this one: 4 / (3/8) s
    assert info.value.retry_after == pytest.approx(4 / (3 / 8))
