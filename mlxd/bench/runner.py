"""One benchmark over HTTP: every phase of a scenario at every concurrency level, ``runs`` times,
each level after a short unmeasured warm-up of the same shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from mlxd.bench import worker_stats
from mlxd.bench.clients import ClientPool
from mlxd.bench.http import Target
from mlxd.bench.progress import Progress
from mlxd.bench.stats import RequestTiming, add_speedup, summarize_groups
from mlxd.bench.workload import Phase, Session, WorkloadOptions, phases, render

_WARMUP_SEED = 999


@dataclass(frozen=True)
class Plan:
    """What to run: the scenario, its levels and repeats.

    Args:
        scenario: one of ``workload.SCENARIOS``.
        levels: concurrency levels, in order.
        runs: measured repeats per level.
        warmup_tokens: output tokens of each level's warm-up (0: none); the warm-up compiles
            the server's kernels for the level's batch shapes, which is not what we measure.
        to_text: turns token-id prompts into text (chat, multi-turn, string-only servers).
        seed: the prompts' seed; rerun against the same server with another one.
        client_procs: client processes the load comes from (see ``clients.ClientPool``).
    """

    scenario: str
    levels: list[int]
    runs: int = 1
    warmup_tokens: int = 16
    to_text: Callable[[list[int]], str] | None = None
    seed: int = 0
    client_procs: int = 1

    def seed_for(self, level: int, run: int) -> int:
        # Unique per level and run: a prompt repeated across levels would hit a prefix cache.
        return self.seed * 1_000_003 + level * 1000 + run


def run_benchmark(
    target: Target,
    plan: Plan,
    opts: WorkloadOptions,
    on_level: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every row of the benchmark, with speedups over concurrency 1 filled in.

    ``on_level`` gets the rows so far after each level, so a run cut short (a time limit on
    the GPU machine) still leaves the levels it finished."""
    rows: list[dict[str, Any]] = []
    with ClientPool(plan.client_procs) as clients:
        for phase in phases(plan.scenario, opts):
            if phase.prime is not None:
                _run(clients, target, 1, [phase.prime], plan, f"{phase.name} prime")
            for level in plan.levels:
                rows += _level(clients, target, phase, level, plan)
                if on_level is not None:
                    on_level(add_speedup(rows))
    return add_speedup(rows)


# Internal helpers


def _level(
    clients: ClientPool, target: Target, phase: Phase, level: int, plan: Plan
) -> list[dict[str, Any]]:
    tag = phase.name
    if plan.warmup_tokens:
        warm = [
            _first_turn(s, plan.warmup_tokens)
            for s in phase.make(level, plan.seed_for(level, _WARMUP_SEED))
        ]
        _run(clients, target, level, warm, plan, f"{tag} c={level} warm-up".strip())
    runs = []
    model = phase.make(1, 0)[0].turns[0].model
    before = worker_stats.fetch(target, model)  # an mlxd worker's speculation counters
    for i in range(plan.runs):
        label = f"{tag} c={level} run {i + 1}/{plan.runs}".strip()
        sessions = phase.make(level, plan.seed_for(level, i))
        runs.append(_run(clients, target, level, sessions, plan, label))
    spec = worker_stats.speculation(before, worker_stats.fetch(target, model) if before else None)
    return [{**row, **spec} for row in summarize_groups(level, runs, phase.tags)]


def _run(
    clients: ClientPool,
    target: Target,
    level: int,
    sessions: list[Session],
    plan: Plan,
    label: str,
) -> list[RequestTiming]:
    if plan.to_text is not None:
        render(sessions, plan.to_text)
    bar = Progress(label, sum(len(s.turns) for s in sessions))
    try:
        return clients.run(target, level, sessions, lambda t: bar.advance(t.error is not None))
    finally:
        bar.close()


def _first_turn(session: Session, max_tokens: int) -> Session:
    return Session([replace(session.turns[0], max_tokens=max_tokens)])
