"""Warm-up at load (issue 41 point 4) on a real engine: its stages run through the engine's own
paths, nothing reaches a client, and afterwards the worker is as if it had just started: no
cached prefix, every block free, no counts; a request then runs exactly as on a cold engine.
"""

from __future__ import annotations

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


def test_a_short_budget_stops_between_stages(harness_factory: Any) -> None:
    from mlxd.worker.warmup import warm_up

    h: Harness = harness_factory(max_num_seqs=8)
    ticks = iter(range(100))
    assert warm_up(h.engine, 2.5, clock=lambda: float(next(ticks))) == 2  # t=1, 2; not 3
    assert h.engine.scheduler.pool is not None and h.engine.scheduler.pool.num_used == 0
