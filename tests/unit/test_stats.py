"""The worker's stats recorder with a scripted clock and real Sequence objects."""

from __future__ import annotations

import pytest

from mlxd.errors import InvalidRequest, Overloaded, WorkerUnavailable
from mlxd.protocol.messages import SamplingParams
from mlxd.worker.sched.sequence import Sequence, SequenceStatus
from mlxd.worker.stats import Stats, summarize


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _seq(rid: str, arrival: float, num_prompt: int = 4) -> Sequence:
    return Sequence(
        request_id=rid,
        client=b"c",
        prompt_ids=list(range(num_prompt)),
        sampling=SamplingParams(),
        max_tokens=8,
        arrival=arrival,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_first_token_is_ttft_and_later_tokens_are_inter_token(clock: Clock) -> None:
    stats = Stats(clock)
    a, b = _seq("a", arrival=100.0), _seq("b", arrival=100.1)
    clock.now = 100.25
    stats.on_tokens([(a, 1), (b, 1)])
    clock.now = 100.3
    stats.on_tokens([(a, 2), (b, 2)])
    reply = stats.reply("s")
    assert reply.ttft.num_samples == 2 and reply.ttft.p99_ms == pytest.approx(250.0)
    assert reply.ttft.p50_ms == pytest.approx(150.0)
    assert reply.itl.num_samples == 2 and reply.itl.p50_ms == pytest.approx(50.0)
    assert reply.output_tokens == 4


def test_a_decode_step_is_timed_from_the_step_before_it_and_idle_time_is_not_a_step(
    clock: Clock,
) -> None:
    stats = Stats(clock)
    for now, rows in [(100.0, 4), (100.01, 4), (100.03, 2), (100.04, 0), (100.5, 2), (100.51, 2)]:
        clock.now = now
        stats.on_step(rows)  # a prefill-only step (0 rows) breaks the chain
    clock.now = 101.0
    stats.on_idle()
    clock.now = 102.0
    stats.on_step(8)  # the first after idling: a step, but no sample
    reply = stats.reply("s")
    assert reply.decode_steps == 6
    assert reply.decode_step.num_samples == 3
    assert reply.decode_step.p99_ms == pytest.approx(20.0)
    assert reply.decode_step.p50_ms == pytest.approx(10.0)
    assert reply.decode_rows_mean == pytest.approx((4 + 2 + 2) / 3)


def test_finished_sequences_are_not_counted(clock: Clock) -> None:
    stats = Stats(clock)
    a = _seq("a", arrival=100.0)
    a.status = SequenceStatus.FINISHED
    stats.on_tokens([(a, 1)])
    assert stats.output_tokens == 0 and stats.reply("s").ttft.num_samples == 0


def test_request_counters_by_outcome(clock: Clock) -> None:
    stats = Stats(clock)
    for i, reason in enumerate(["stop", "length", "cancelled", "error"]):
        seq = _seq(str(i), arrival=100.0, num_prompt=3)
        stats.on_admit(seq)
        stats.on_finish(seq, reason)
    stats.on_refuse(Overloaded("full"))
    stats.on_refuse(WorkerUnavailable("draining"))
    stats.on_refuse(InvalidRequest("bad"))
    r = stats.reply("s")
    assert (r.requests_admitted, r.prompt_tokens) == (4, 12)
    assert (r.requests_finished, r.requests_cancelled, r.requests_errored) == (2, 1, 2)
    assert r.requests_rejected == 2 and r.preemptions == 0 and r.prefix_cache_hits == 0


def test_recent_throughput_covers_only_the_window(clock: Clock) -> None:
    stats = Stats(clock, window_s=10)
    seqs = [_seq(str(i), arrival=100.0) for i in range(10)]
    stats.on_tokens([(s, 1) for s in seqs])  # 10 tokens at t=100
    clock.now = 130.0
    assert stats.output_tps_recent() == 0.0
    stats.on_tokens([(s, 1) for s in seqs])  # 10 more at t=130
    clock.now = 130.5
    assert stats.output_tps_recent() == pytest.approx(10 / 9.5)
    assert stats.reply("s").output_tps_total == pytest.approx(20 / 30.5)
    assert len(stats._buckets) == 1, "old buckets are dropped"


def test_samples_and_in_flight_state_stay_bounded(clock: Clock) -> None:
    stats = Stats(clock, max_samples=16)
    seqs = [_seq(str(i), arrival=100.0) for i in range(8)]
    for step in range(100):
        clock.now += 0.01
        stats.on_tokens([(s, step) for s in seqs])
    for s in seqs:
        stats.on_finish(s, "length")
    assert stats.reply("s").itl.num_samples == 16 and not stats._last_token
    assert stats.output_tokens == 800 and len(stats._buckets) <= 11


def test_summarize_nearest_rank() -> None:
    s = summarize([float(i) for i in range(1, 101)])
    assert (s.num_samples, s.p50_ms, s.p95_ms, s.p99_ms) == (100, 50.0, 95.0, 99.0)
    assert summarize([]).num_samples == 0


def test_images_per_second_covers_only_the_window(clock: Clock) -> None:
    from types import SimpleNamespace

    stats = Stats(clock, window_s=10)
    text, image = _seq("t", arrival=100.0), _seq("i", arrival=100.0)
    image.images = SimpleNamespace(digests=["a", "b", "c"])  # a prompt's three images
    clock.now = 101.0
    stats.on_admit(text)
    stats.on_admit(image)
    clock.now = 105.0
    reply = stats.reply("s")
    assert reply.images == 3
    assert reply.images_per_s_recent == pytest.approx(3 / 5.0)  # since start: 5 s
    clock.now = 125.0  # the window has gone past them
    assert stats.reply("s").images_per_s_recent == 0.0
    assert stats.reply("s").images == 3
