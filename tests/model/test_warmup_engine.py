"""Warm-up at load (issue 41 point 4) on a real engine: its stages run through the engine's own
paths, nothing reaches a client, and afterwards the worker is as if it had just started: no
cached prefix, every block free, no counts; a request then runs exactly as on a cold engine.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.model.conftest import Harness

pytestmark = pytest.mark.model

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 8  # 64 tokens: two full blocks of 16 and more


def report_cached(scheduler: Any) -> int:
    return int(scheduler.kv_report().blocks_cached)


def _warm(h: Harness, budget_s: float = 60.0) -> int:
    from mlxd.worker.warmup import warm_up

    return warm_up(h.engine, budget_s)


def test_warm_up_runs_every_stage_and_leaves_no_trace(harness_factory: Any) -> None:
    from mlxd.worker.warmup import stages

    h: Harness = harness_factory(prefill_chunk=64, max_num_seqs=8)
    sent: list[object] = []
    h.engine.channel.send = lambda client, msg: sent.append(msg)  # type: ignore[method-assign]
    plan = stages(h.engine)
    assert [s.name for s in plan][1:] == [f"decode at {n} rows" for n in (1, 2, 4, 8)]
    assert _warm(h) == len(plan)
    scheduler, pool = h.engine.scheduler, h.engine.scheduler.pool
    assert pool is not None and pool.num_used == 0  # every block free
    assert report_cached(scheduler) == 0  # nothing cached
    assert not scheduler.has_work() and not h.engine.runner.rows
    report = scheduler.kv_report()
    assert (report.hits, report.misses, report.preemptions) == (0, 0, 0)
    stats = h.engine.stats.reply("r")
    assert (stats.requests_admitted, stats.decode_steps, stats.decode_row_forwards) == (0, 0, 0)
    assert sent == [] and h.engine.warming == ""
    scheduler.check_invariants()


def test_a_request_after_warm_up_runs_as_on_a_cold_engine(harness_factory: Any) -> None:
    cold: Harness = harness_factory(prefill_chunk=64)
    expected = cold.run_alone("a", PROMPT)
    warmed: Harness = harness_factory(prefill_chunk=64)
    _warm(warmed)
    got = warmed.run_alone("a", PROMPT)
    assert got.token_ids == expected.token_ids
    assert got.finished is not None and got.finished.usage.cached_tokens == 0


def test_no_budget_no_warm_up(harness_factory: Any) -> None:
    h: Harness = harness_factory()
    stats = h.engine.stats
    assert _warm(h, budget_s=0) == 0
    assert h.engine.stats is stats and stats.decode_steps == 0


def test_the_budget_stops_a_stage_between_its_steps(harness_factory: Any) -> None:
    """A stage longer than the budget is cut at the first step past it (an H100 built kernels
    for longer than the whole budget within one stage), and leaves nothing behind."""
    from mlxd.worker.warmup import stages, warm_up

    h: Harness = harness_factory(prefill_chunk=16, max_num_seqs=8)
    assert stages(h.engine)[0].name == "a 32-token prompt"  # four steps: two chunks, two tokens
    now, step = [0.0], h.engine.step

    def timed_step() -> None:  # each step takes a second
        now[0] += 1.0
        step()

    h.engine.step = timed_step  # type: ignore[method-assign]
    assert warm_up(h.engine, 1.5, clock=lambda: now[0]) == 0
    assert now[0] == 2.0  # steps at t=0 and t=1; none started past the budget
    assert h.engine.scheduler.pool is not None and h.engine.scheduler.pool.num_used == 0
    assert not h.engine.scheduler.has_work() and h.engine.warming == ""
    h.engine.scheduler.check_invariants()


def test_stages_that_fit_the_budget_all_count(harness_factory: Any, caplog: Any) -> None:
    from mlxd.worker.warmup import warm_up

    h: Harness = harness_factory(prefill_chunk=16, max_num_seqs=8)
    now, step = [0.0], h.engine.step

    def timed_step() -> None:
        now[0] += 1.0
        step()

    h.engine.step = timed_step  # type: ignore[method-assign]
    # the prompt stage ends at t=4, "decode at 1 rows" at t=8: cut within the third stage
    with caplog.at_level(logging.INFO, logger="mlxd.worker"):
        assert warm_up(h.engine, 9.5, clock=lambda: now[0]) == 2
    assert now[0] == 10.0
    # each stage that ran is timed in the log (a slow start says which stage took it)
    timed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up: ")]
    assert timed == ["warm-up: a 32-token prompt in 4.00 s", "warm-up: decode at 1 rows in 4.00 s"]
    assert h.engine.scheduler.pool is not None and h.engine.scheduler.pool.num_used == 0


def test_a_slow_step_is_logged_with_what_it_held(harness_factory: Any, caplog: Any) -> None:
    """A step is never cut, so one that outlasts the budget says what it ran (run MS1)."""
    from mlxd.worker.warmup import warm_up

    h: Harness = harness_factory(prefill_chunk=16, max_num_seqs=2)
    now, step = [0.0], h.engine.step
    took = iter([2.5])  # the first step (the long prompt's first chunk) is slow, the rest not

    def timed_step() -> None:
        now[0] += next(took, 0.5)
        step()

    h.engine.step = timed_step  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="mlxd.worker"):
        warm_up(h.engine, 60.0, clock=lambda: now[0])
    slow = [r.getMessage() for r in caplog.records if "a step of" in r.getMessage()]
    assert slow == [
        "warm-up: a step of a 32-token prompt took 2.50 s (1 prompts to prefill, 0 rows decoding)"
    ]


def test_decode_stages_start_as_a_burst_of_chat_prompts(harness_factory: Any) -> None:
    """Each decode stage's rows arrive as a burst of chat-sized prompts, prefilled together: the
    batched shapes a burst after the start needs are built before the worker serves."""
    from mlxd.worker.warmup import BATCH_PROMPT_TOKENS, stages

    h: Harness = harness_factory(prefill_chunk=512, max_num_seqs=2)
    plan = stages(h.engine)
    assert [len(p) for s in plan[1:] for p in s.prompts] == [BATCH_PROMPT_TOKENS] * (1 + 2)
    batches: list[list[int]] = []
    prefill = h.engine.runner.prefill

    def recorded(chunks: list[Any]) -> Any:
        batches.append([c.num_tokens for c in chunks])
        return prefill(chunks)

    h.engine.runner.prefill = recorded  # type: ignore[method-assign]
    assert _warm(h) == len(plan)
    assert [BATCH_PROMPT_TOKENS] * 2 in batches  # the two rows' prompts in one step


def test_a_first_long_prompt_after_warm_up_builds_no_attention_plan(
    harness_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where attention plans are built per shape (CUDA, forced here): a first prompt of three
    chunks after warm-up brings attention one new shape, its last chunk's (its remainder's
    queries over the whole length), and that runs as plain ops, not as a new plan; its tokens
    are a cold exact engine's."""
    import mlx.core as mx

    from mlxd.worker.kv import attention_shapes

    prompt = [(7 * i) % 50 + 10 for i in range(64 * 2 + 40)]  # two chunks and a remainder
    expected = harness_factory(prefill_chunk=64).run_alone("a", prompt).token_ids
    shapes: set[tuple[int, int, int]] = set()
    exact = mx.fast.scaled_dot_product_attention

    def recording(q: mx.array, k: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if q.shape[-2] > 1:
            shapes.add((q.shape[0], q.shape[-2], k.shape[-2]))
        return exact(q, k, *args, **kwargs)

    monkeypatch.setattr(attention_shapes, "BUCKETED", True)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", recording)
    assert attention_shapes.install()
    h: Harness = harness_factory(prefill_chunk=64, max_num_seqs=4)
    _warm(h)
    built = set(shapes)
    got = h.run_alone("a", prompt).token_ids
    assert (1, 64, 128) in built  # warm-up's second chunk: the first two chunks' plans exist
    assert shapes == built  # the last chunk's shape reached no plan
    assert got == expected
