from __future__ import annotations

import pytest

from mlxd.config import SchedulerConfig
from mlxd.errors import Overloaded
from mlxd.protocol.messages import SamplingParams
from mlxd.worker.sched.embed_job import EmbedJob
from mlxd.worker.sched.prefill_cost import PrefillCost
from mlxd.worker.sched.scheduler import EmbedChunk, Scheduler
from mlxd.worker.sched.sequence import PRIORITY_LEVELS, Sequence, SequenceStatus


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_seq(rid: str, n_prompt: int = 4, priority: str = "normal", at: float = 0.0) -> Sequence:
    return Sequence(
        request_id=rid,
        client=b"c",
        prompt_ids=list(range(n_prompt)),
        sampling=SamplingParams(),
        max_tokens=8,
        priority=PRIORITY_LEVELS[priority],
        arrival=at,
    )


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


def chunk_spans(s: Scheduler, steps: int) -> list[tuple[int, int]]:
    spans = []
    for _ in range(steps):
        for c in s.schedule_prefill():
            spans.append((c.start, c.end))
            s.complete_chunk(c)
    return spans


def test_beside_running_streams_a_long_prompts_chunks_shrink_to_the_budgets_cost(
    clock: Clock,
) -> None:
    cost = PrefillCost(knee=256.0)
    s = Scheduler(SchedulerConfig(prefill_chunk=256), clock=clock, cost=cost)
    s.add(make_seq("stream"))
    run_prefill(s)  # now decoding: every later chunk is sized by cost
    s.add(make_seq("long", n_prompt=4000))
    spans = chunk_spans(s, 40)
    sizes = [end - start for start, end in spans]
    assert sizes[0] == 256  # the prompt's first chunk costs its tokens
    assert sizes == sorted(sizes, reverse=True) and sizes[1] < 256
    assert min(sizes[:-1]) == 256 // 4  # never below 1/4 of the budget
    assert all(cost.of(start, end - start) <= 256 for start, end in spans if end - start > 64)


def test_with_no_stream_running_a_chunk_takes_the_whole_budget(clock: Clock) -> None:
    s = Scheduler(SchedulerConfig(prefill_chunk=256), clock=clock, cost=PrefillCost(knee=256.0))
    s.add(make_seq("long", n_prompt=1000))
    assert chunk_spans(s, 4) == [(0, 256), (256, 512), (512, 768), (768, 1000)]


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


def make_job(rid: str, lengths: list[int], priority: str = "normal", at: float = 0.0) -> EmbedJob:
    return EmbedJob(
        request_id=rid,
        client=b"c",
        input_ids=[[7] * n for n in lengths],
        priority=PRIORITY_LEVELS[priority],
        arrival=at,
    )


def embed_spans(s: Scheduler) -> list[tuple[str, int, int, int]]:
    """One step's embedding work: (request id, start, end, padded tokens)."""
    return [
        (c.job.request_id, c.start, c.end, c.num_tokens)
        for c in s.schedule_prefill()
        if isinstance(c, EmbedChunk)
    ]


def test_embeddings_run_a_padded_budget_of_inputs_per_step_shortest_first(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    job = make_job("e", [5, 2, 4, 3, 9, 8])
    s.add_embed(job)
    assert job.order == [1, 3, 2, 0, 5, 4]
    assert embed_spans(s) == [("e", 0, 3, 12)]  # 2, 3, 4 padded to 4; a 4th would pad to 20
    assert embed_spans(s) == [("e", 3, 5, 16)]  # 5 and 8, padded to 8
    assert embed_spans(s) == [("e", 5, 6, 9)]
    assert not s.has_work()


def embed_pieces(s: Scheduler) -> list[tuple[int, int] | None]:
    return [c.piece for c in s.schedule_prefill() if isinstance(c, EmbedChunk)]


def test_an_input_longer_than_a_step_goes_a_prompt_chunk_at_a_time(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    job = make_job("e", [3, 40, 2])
    s.add_embed(job)
    assert embed_spans(s) == [("e", 0, 2, 6)]  # 2 and 3; 40 does not fit the 10 left whole
    assert embed_pieces(s) == [(0, 16)]  # ... nor any step: a piece per step, as a prompt
    assert embed_pieces(s) == [(16, 32)]
    assert embed_spans(s) == [("e", 2, 3, 8)]  # its last piece ends the request
    assert not s.has_work() and job.offset == 0


def test_a_long_inputs_pieces_cost_what_a_prompts_chunks_do(clock: Clock) -> None:
    s = Scheduler(SchedulerConfig(prefill_chunk=64), clock=clock, cost=PrefillCost(knee=64.0))
    s.add(make_seq("stream", n_prompt=4))
    assert run_prefill(s) == ["stream"]  # a stream decodes: chunks spend the budget as cost
    s.add_embed(make_job("e", [300]))
    pieces = [embed_pieces(s)[0] for _ in range(3)]
    assert pieces == [(0, 64), (64, 96), (96, 121)]  # shorter deeper in, as a prompt's chunks


def test_embeddings_and_prompts_share_the_budget_in_priority_order(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    s.add_embed(make_job("e", [4, 4, 4, 4, 4], at=1.0))
    s.add(make_seq("first", n_prompt=6, at=0.0))
    s.add(make_seq("high", n_prompt=6, priority="high", at=2.0))
    step = s.schedule_prefill()
    names = [c.job.request_id if isinstance(c, EmbedChunk) else c.seq.request_id for c in step]
    assert names == ["high", "first", "e"]
    assert sum(c.num_tokens for c in step) <= 16  # high 6 + first 6 + one 4-token input


def test_the_queue_limit_counts_embeddings_requests(clock: Clock) -> None:
    s = sched(clock, max_queued=2)
    s.add_embed(make_job("e", [3]))
    s.add(make_seq("a"))
    with pytest.raises(Overloaded):
        s.add_embed(make_job("f", [3]))


def test_dropping_an_embeddings_request_forgets_its_inputs(clock: Clock) -> None:
    s = sched(clock, prefill_chunk=16)
    s.add_embed(make_job("e", [8, 8, 8, 8]))
    assert embed_spans(s) == [("e", 0, 2, 16)]
    job = s.find_embed("e", b"c")
    assert job is not None
    s.drop_embed(job)
    assert s.find_embed("e", b"c") is None and not s.has_work() and embed_spans(s) == []
