"""Prefix caching for models the paged pool cannot hold (recurrent state, sliding windows):
snapshots of the whole cache list at a prompt's last block boundary and at the end of each
finished sequence; a hit restores one and continues exactly as a cold prompt would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxd.models.maker import make_model
from mlxd.models.zoo import make_zoo_model
from tests.model.conftest import Harness
from tests.model.test_engine import PROMPTS, reference_ids

pytestmark = pytest.mark.model

BLOCK = 16
LONG = PROMPTS[1] * 3  # past the window and several blocks


# Falcon-H1 is a hybrid whose layers hold cache lists (attention and Mamba in one entry), which
# the block pool does not take; LFM2-like hybrids are paged (tests/model/test_hybrid_paged.py).
# RecurrentGemma mixes recurrent layers and sliding windows; windows beside full attention alone
# are paged (tests/model/test_window_slabs.py).
@pytest.fixture(scope="module", params=["falcon_h1", "mamba", "recurrent_gemma"])
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "m"
    if request.param != "mamba":
        return make_zoo_model(out, request.param)
    return make_model(out, arch="mamba", size="tiny", progress=lambda line: None)


def test_a_repeated_prompt_hits_its_last_block_and_continues_as_cold(model_path: Path) -> None:
    h = Harness(model_path, block_size=BLOCK)
    try:
        ids = h.engine.encoder.tokenizer.encode(LONG)
        cold = h.run_alone("cold", ids)
        hit = h.run_alone("hit", ids)
        report = h.engine.scheduler.kv_report()  # what stats and /metrics show
        assert h.engine.runner.flush_prefix_cache() > 0  # mlxd worker flush-cache
        flushed = h.run_alone("flushed", ids)
    finally:
        h.close()
    assert cold.finished.usage.cached_tokens == 0
    assert hit.finished.usage.cached_tokens == (len(ids) - 1) // BLOCK * BLOCK > 0
    assert hit.token_ids == cold.token_ids == reference_ids(model_path, ids, 12)
    assert flushed.finished.usage.cached_tokens == 0
    assert (report.hits, report.misses, report.hit_tokens) == (
        1,
        1,
        hit.finished.usage.cached_tokens,
    )


def test_the_next_turn_hits_the_whole_previous_turn(model_path: Path) -> None:
    """A finished sequence leaves a snapshot of its prompt and output: the next turn, which
    resends both, prefills only what it adds."""
    h = Harness(model_path, block_size=BLOCK)
    try:
        first = h.engine.encoder.tokenizer.encode(PROMPTS[3])
        turn1 = h.run_alone("1", first)
        second = first + turn1.token_ids + [40, 41, 42]
        turn2 = h.run_alone("2", second)
        other = h.run_alone("other", [7] + second[1:])  # differs at its first token: no hit
    finally:
        h.close()
    assert turn2.finished.usage.cached_tokens == len(first) + len(turn1.token_ids)
    assert turn2.token_ids == reference_ids(model_path, second, 12)
    assert other.finished.usage.cached_tokens == 0


def test_snapshots_stay_within_their_budget(model_path: Path) -> None:
    h = Harness(model_path, block_size=BLOCK)
    try:
        snapshots = h.engine.runner.snapshots
        tok = h.engine.encoder.tokenizer
        h.run_alone("a", tok.encode(LONG))
        one = snapshots.nbytes / len(snapshots)
        snapshots.budget_bytes = int(2.5 * one)
        for i, prompt in enumerate(PROMPTS):
            if prompt * 3 != LONG:
                h.run_alone(f"p{i}", tok.encode(prompt * 3), max_tokens=4)
                assert 0 < snapshots.nbytes <= snapshots.budget_bytes
        again = h.run_alone("again", tok.encode(LONG))
        assert again.finished.usage.cached_tokens == 0  # the least recently used went first
    finally:
        h.close()


def test_prompts_sharing_a_system_prompt_hit_it_whatever_follows(model_path: Path) -> None:
    """The second prompt that shares a block-aligned prefix with an earlier one snapshots it;
    every later one with that prefix, whatever its question, hits it."""
    h = Harness(model_path, block_size=BLOCK)
    try:
        system = h.engine.encoder.tokenizer.encode(LONG)[: 3 * BLOCK]
        questions = [list(range(q, q + BLOCK + 4)) for q in (100, 200, 300)]  # a block and more
        first = h.run_alone("1", system + questions[0])
        second = h.run_alone("2", system + questions[1])
        third = h.run_alone("3", system + questions[2])
    finally:
        h.close()
    assert first.finished.usage.cached_tokens == second.finished.usage.cached_tokens == 0
    assert third.finished.usage.cached_tokens == len(system)
    assert third.token_ids == reference_ids(model_path, system + questions[2], 12)


def test_rows_over_the_budget_are_preempted_and_resume_from_their_snapshots(
    model_path: Path,
) -> None:
    """Past the KV budget the most recent row leaves the batch with a snapshot of its caches
    and resumes from it (one token computed again, not its whole prompt and output); every
    output equals mlx-lm's."""
    h = Harness(model_path, block_size=BLOCK)
    try:
        tok = h.engine.encoder.tokenizer
        prompts = [tok.encode(p * 2) for p in PROMPTS[:3]]
        h.generate_ids("probe", tok.encode(PROMPTS[4] * 2), max_tokens=40, ignore_eos=True)
        h.step(3)
        one_row = h.engine.runner.kv_bytes
        h.run()
        h.engine.runner.kv_budget = int(2.5 * one_row)  # room for two rows, not three
        hits = h.engine.runner.snapshots.counters.hits
        for i, ids in enumerate(prompts):
            h.generate_ids(f"r{i}", ids, max_tokens=40, ignore_eos=True)
        results = h.run()
        preemptions = h.engine.scheduler.counters.preemptions
        hits = h.engine.runner.snapshots.counters.hits - hits
    finally:
        h.close()
    assert preemptions > 0
    assert hits == preemptions  # every resume, and nothing else (the prompts share nothing)
    for i, ids in enumerate(prompts):
        assert results[f"r{i}"].token_ids == reference_ids(model_path, ids, 40), i


class _Counting:
    """The model, recording the shape of every forward's tokens."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, tokens: Any, cache: Any = None) -> Any:
        self.shapes.append(tuple(tokens.shape))
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def test_new_prompts_prefill_in_one_forward_and_continue_as_alone(model_path: Path) -> None:
    """Whole new prompts of different lengths prefill together, right-padded: one forward for
    all but their last tokens (which run in the first decode step, as mlx-lm feeds them). Each
    continues as it would alone, and each leaves a snapshot a repeat of its prompt hits."""
    from tests.model.conftest import Result

    h = Harness(model_path, block_size=BLOCK)
    counting = _Counting(h.engine.runner.model)
    h.engine.runner.model = counting
    try:
        tokenizer = h.engine.encoder.tokenizer
        prompts = [tokenizer.encode(p) for p in (LONG, PROMPTS[1], PROMPTS[0] * 2)]
        for i, ids in enumerate(prompts):
            h.results[str(i)] = Result()
            h.generate_ids(str(i), ids, max_tokens=12, ignore_eos=True)
        out = h.run()
        again = h.run_alone("again", prompts[1])
    finally:
        h.close()
    # mlx-lm's Mamba and RecurrentGemma let right padding into their state (they read no
    # lengths from their caches): the load probe sees it, and their prompts prefill one at a time.
    together = model_path.parent.name.rstrip("0123456789") not in ("mamba", "recurrent_gemma")
    assert h.engine.runner.prefills_together == together
    assert ((3, max(len(p) for p in prompts) - 1) in counting.shapes) == together
    for i, ids in enumerate(prompts):
        assert out[str(i)].token_ids == reference_ids(model_path, ids, 12), i
    n = len(prompts[1])
    assert again.finished.usage.cached_tokens == (n - 1 if together else (n - 1) // BLOCK * BLOCK)
    assert again.token_ids == out["1"].token_ids
