"""What each `mlxd bench run` scenario sends (no server needed)."""

from __future__ import annotations

import pytest

from mlxd.bench.workload import WorkloadOptions, make_prompts, phases, render, words


def _opts(**kw: object) -> WorkloadOptions:
    return WorkloadOptions(models=("m",), prompt_tokens=16, max_tokens=4, **kw)  # type: ignore[arg-type]


def test_prompts_have_the_exact_length_and_differ_by_seed() -> None:
    a, b = make_prompts(2, 50, seed=1), make_prompts(2, 50, seed=2)
    assert [len(p) for p in a] == [50, 50] and a != b and a == make_prompts(2, 50, seed=1)


def test_shared_prefix_cold_prefixes_differ_and_hits_share_the_primed_one() -> None:
    cold, hit = phases("shared-prefix", _opts(prefix_tokens=(64,)))
    assert cold.tags == hit.tags == {"prefix_tokens": 64} and cold.prime is None
    cold_reqs = [s.turns[0] for s in cold.make(4, 0)]
    assert len({tuple(r.prefix) for r in cold_reqs}) == 4  # type: ignore[arg-type]
    assert all(r.group == "cold" and len(r.prefix) == 64 for r in cold_reqs)  # type: ignore[arg-type]
    hit_reqs = [s.turns[0] for s in hit.make(4, 0)]
    assert hit.prime is not None and {tuple(r.prefix) for r in hit_reqs} == {  # type: ignore[arg-type]
        tuple(hit.prime.turns[0].prefix)  # type: ignore[arg-type]
    }
    assert len({tuple(r.user) for r in hit_reqs}) == 4, "only the user part differs"  # type: ignore[arg-type]


def test_two_runs_of_a_cold_phase_never_share_a_prefix() -> None:
    (cold, _) = phases("shared-prefix", _opts(prefix_tokens=(32,)))
    first = {tuple(s.turns[0].prefix) for s in cold.make(2, 0)}  # type: ignore[arg-type]
    again = {tuple(s.turns[0].prefix) for s in cold.make(2, 0)}  # type: ignore[arg-type]
    assert not first & again


def test_multi_turn_sessions_carry_history_with_one_group_per_turn() -> None:
    (phase,) = phases("multi-turn", _opts(turns=3))
    sessions = phase.make(2, 0)
    assert len(sessions) == 2 and all(s.carry_history for s in sessions)
    assert [r.group for r in sessions[0].turns] == ["turn 1", "turn 2", "turn 3"]


def test_mixed_cycles_prompt_lengths_as_groups() -> None:
    (phase,) = phases("mixed", _opts(mixed_lengths=(8, 32)))
    reqs = [s.turns[0] for s in phase.make(4, 0)]
    assert sorted((r.group, len(r.user)) for r in reqs) == [("32 tok", 32)] * 2 + [("8 tok", 8)] * 2


def test_priority_mix_sends_the_x_priority_header() -> None:
    (phase,) = phases("priority-mix", _opts(high_fraction=0.25))
    reqs = [s.turns[0] for s in phase.make(8, 0)]
    assert sorted(r.group for r in reqs) == ["high"] * 2 + ["low"] * 6
    assert all(r.headers == {"X-Priority": r.group} for r in reqs)


def test_several_models_go_round_robin_one_group_each() -> None:
    (phase,) = phases("multi-model", WorkloadOptions(models=("a", "b"), prompt_tokens=4))
    reqs = [s.turns[0] for s in phase.make(4, 0)]
    assert [(r.model, r.group) for r in reqs] == [("a", "a"), ("b", "b")] * 2
    assert [r.model for s in phase.make(1, 0) for r in s.turns] == ["a", "b"], "both at level 1"


def test_render_turns_ids_into_text_in_place() -> None:
    cold, _ = phases("shared-prefix", _opts(prefix_tokens=(8,)))
    sessions = cold.make(1, 0)
    ids = sessions[0].turns[0].user
    render(sessions, words)
    assert sessions[0].turns[0].user == words(ids) and len(words(ids).split()) == len(ids)  # type: ignore[arg-type]
    assert isinstance(sessions[0].turns[0].prefix, str)


@pytest.mark.parametrize("scenario", ["throughput", "chat", "json"])
def test_each_request_has_an_image_of_its_own_when_asked(scenario: str) -> None:
    (phase,) = phases(scenario, _opts(image_size=32))
    images = [s.turns[0].image for s in phase.make(4, 0)]
    assert all(i is not None and i.startswith("data:image/png;base64,") for i in images)
    assert len(set(images)) == 4
    (plain,) = phases("throughput", _opts())
    assert {s.turns[0].image for s in plain.make(2, 0)} == {None}


def test_shared_image_hits_share_the_primed_image_and_cold_ones_never_do() -> None:
    cold, hit = phases("shared-image", _opts(image_size=32))
    assert cold.tags == hit.tags == {"image_size": 32} and cold.prime is None
    cold_reqs = [s.turns[0] for s in cold.make(3, 0)]
    assert len({r.image for r in cold_reqs}) == 3 and {r.group for r in cold_reqs} == {"cold"}
    assert hit.prime is not None
    hit_reqs = [s.turns[0] for s in hit.make(3, 0)]
    assert {r.image for r in hit_reqs} == {hit.prime.turns[0].image} - {None}
    assert {r.group for r in hit_reqs} == {"hit"} and len({tuple(r.user) for r in hit_reqs}) == 3  # type: ignore[arg-type]
