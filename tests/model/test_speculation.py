"""Speculative decoding in the batch (prompt lookup): exact output, KV rolled back, opt-out.

The tiny random model repeats itself a lot, so its own output gives prompt lookup drafts that are
often right and often wrong: both paths of the verification run. The controller is pinned on
(``adaptive = False``) so every step with a drafting row verifies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxd.protocol.messages import JsonFormat, SamplingParams, TextPrompt
from mlxd.worker.kv import attention_shapes
from mlxd.worker.runners import paged as paged_runner
from mlxd.worker.sampling.sampling import SampleRow, sample
from mlxd.worker.spec import verification

pytestmark = pytest.mark.model

PROMPTS = [
    "a b c d e f a b c d e f a b c",
    "hello world hello world hello",
    "the quick brown fox",
    "1 2 3 1 2 3 1 2",
]


@pytest.fixture(autouse=True, params=[False, True], ids=["window", "rows"])
def verify_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both verification forwards (``runners.paged.VIRTUAL_ROWS``): every test runs each."""
    monkeypatch.setattr(paged_runner, "VIRTUAL_ROWS", request.param)


def _harness(factory: Any, mode: str, **kw: Any) -> Any:
    h = factory(speculate=mode, **kw)
    h.engine.speculator.adaptive = False
    return h


def _check_blocks(h: Any) -> None:
    """After a step every running row holds just the blocks of its computed tokens: rejected
    drafts' blocks went back to the pool."""
    bs = h.engine.scheduler.pool.block_size
    for seq in h.engine.scheduler.running:
        assert len(seq.block_ids) == max(1, -(-seq.num_computed // bs)), seq.request_id


def _busy_batch(h: Any) -> dict[str, list[int]]:
    """Rows that speculate and rows that do not (opt-out, penalties), joining and leaving."""
    h.generate("a", PROMPTS[0], max_tokens=40, ignore_eos=True)
    h.generate("b", PROMPTS[1], max_tokens=12, ignore_eos=True, speculate=False)
    for _ in range(3):
        h.step()
        _check_blocks(h)
    h.generate("c", PROMPTS[2], max_tokens=30, ignore_eos=True, repetition_penalty=1.3)
    h.generate("d", PROMPTS[3], max_tokens=25, ignore_eos=True, temperature=0.9, seed=7)
    for _ in range(5):
        h.step()
        _check_blocks(h)
    h.generate(
        "e",
        PROMPTS[0] + " x",
        max_tokens=20,
        ignore_eos=True,
        temperature=0.7,
        seed=3,
        top_p=0.9,
        min_tokens=5,
    )
    results = h.run()
    assert all(r.error is None for r in results.values())
    return {rid: r.token_ids for rid, r in results.items()}


def test_greedy_output_is_the_same_alone(harness_factory: Any) -> None:
    outputs = {}
    for mode in ("off", "ngram"):
        h = _harness(harness_factory, mode)
        for i, prompt in enumerate(PROMPTS):
            h.generate(str(i), prompt, max_tokens=40, ignore_eos=True)
            h.run()
        outputs[mode] = {k: r.token_ids for k, r in h.results.items()}
        counters = h.engine.speculator.counters
    assert outputs["ngram"] == outputs["off"]
    assert counters.accepted > 0 and counters.drafted > counters.accepted  # both paths ran


def test_a_lone_row_verifies_on_decode_s_view(harness_factory: Any) -> None:
    """One row verifies over decode's view (``ViewVerifyCache``): the same tokens as without
    speculation over a long answer (the view grows past its first ``VIEW_STEP`` columns, in a
    verification or a plain step, and is flushed into the pool while it runs), and the blocks
    that flush left in the prefix cache hold the accepted tokens' K/V: the next turn's output
    over them is a fresh worker's."""
    outputs, runs = {}, {}
    for mode in ("off", "ngram"):
        h = _harness(harness_factory, mode, num_blocks=64, block_size=4)
        h.generate("a", PROMPTS[0], max_tokens=150, ignore_eos=True)
        while h.engine.scheduler.has_work():
            h.step()
            _check_blocks(h)
        outputs[mode], runs[mode] = h.results["a"].token_ids, h
    assert outputs["ngram"] == outputs["off"]
    h = runs["ngram"]
    c = h.engine.speculator.counters
    assert h.engine.runner.view_verifications == c.verify_steps > 10
    assert c.drafted > c.accepted > 0
    follow = _follow_up(h, outputs["ngram"])
    assert follow[1] > 0
    assert _follow_up(runs["off"], outputs["off"])[0] == follow[0]


def test_busy_mixed_batch_is_the_same_and_seeded_sampling_too(harness_factory: Any) -> None:
    off = _busy_batch(_harness(harness_factory, "off"))
    h = _harness(harness_factory, "ngram")
    on = _busy_batch(h)
    assert on == off  # greedy rows, and seeded sampled rows ("d", "e") token for token
    c = h.engine.speculator.counters
    assert c.accepted > 0 and c.verify_steps > 0


def test_padded_attention_shapes_change_no_token(
    harness_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lengths CUDA runs with (``attention_shapes``): verification windows, prefill chunks
    and the keys they read padded and masked, here on the CPU."""
    off = _busy_batch(_harness(harness_factory, "off"))
    monkeypatch.setattr(attention_shapes, "BUCKETED", True)
    h = _harness(harness_factory, "ngram")
    assert _busy_batch(h) == off
    assert h.engine.speculator.counters.accepted > 0
    turn = h.results["a"].token_ids
    follow = _follow_up(h, turn)  # a prefix hit: a padded chunk over cached blocks
    assert follow[1] > 0
    monkeypatch.setattr(attention_shapes, "BUCKETED", False)
    assert _follow_up(_harness(harness_factory, "off"), turn)[0] == follow[0]


def test_rollback_keeps_the_pool_and_the_prefix_cache_exact(harness_factory: Any) -> None:
    h = _harness(harness_factory, "ngram", num_blocks=64, block_size=4)
    h.generate("a", PROMPTS[0], max_tokens=40, ignore_eos=True)
    h.generate("b", PROMPTS[3], max_tokens=40, ignore_eos=True)
    while h.engine.scheduler.has_work():
        h.step()  # checks the pool's and the radix tree's invariants
        _check_blocks(h)
    sched = h.engine.scheduler
    assert sched.pool.num_used == sched.radix.num_cached_blocks  # no block leaked
    assert h.engine.speculator.counters.drafted > h.engine.speculator.counters.accepted
    # The next turn hits the cached blocks: they hold the K/V of accepted tokens only, so its
    # output is the output of a fresh worker without speculation.
    turn = h.results["a"].token_ids
    follow = _follow_up(h, turn)
    assert follow[1] > 0
    fresh = _harness(harness_factory, "off", num_blocks=64, block_size=4)
    assert _follow_up(fresh, turn)[0] == follow[0]


def _follow_up(h: Any, turn: list[int]) -> tuple[list[int], int]:
    prompt = h.engine.encoder.encode(TextPrompt(text=PROMPTS[0]))
    h.generate_ids("next", prompt + turn + prompt[:5], max_tokens=16, ignore_eos=True)
    res = h.run()["next"]
    assert res.finished is not None
    return res.token_ids, res.finished.usage.cached_tokens


def test_a_request_may_opt_out(harness_factory: Any) -> None:
    h = _harness(harness_factory, "ngram")
    h.generate("a", PROMPTS[0], max_tokens=30, ignore_eos=True, speculate=False)
    h.run()
    assert h.engine.speculator.counters.drafted == 0
    h.generate("b", PROMPTS[0], max_tokens=30, ignore_eos=True)
    h.run()
    assert h.engine.speculator.counters.drafted > 0
    assert h.results["a"].token_ids == h.results["b"].token_ids


def test_logprobs_and_grammar_are_kept(harness_factory: Any) -> None:
    fmt = JsonFormat(
        schema=json.dumps({"type": "array", "items": {"enum": ["ab", "cd"]}, "maxItems": 12})
    )
    results = {}
    for mode in ("off", "ngram"):
        h = _harness(harness_factory, mode)
        h.generate("lp", PROMPTS[1], max_tokens=30, ignore_eos=True, logprobs=True, top_logprobs=2)
        h.generate(
            "json", 'list: ["ab", "cd", "ab", "cd", "ab"', max_tokens=80, response_format=fmt
        )
        results[mode] = h.run()
    lp_off, lp_on = results["off"]["lp"], results["ngram"]["lp"]
    assert lp_on.token_ids == lp_off.token_ids
    assert [e.token_id for e in lp_on.logprobs] == lp_on.token_ids
    for a, b in zip(lp_on.logprobs, lp_off.logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t.token_id for t in a.top_logprobs] == [t.token_id for t in b.top_logprobs]
    json_on = results["ngram"]["json"]
    assert json_on.token_ids == results["off"]["json"].token_ids
    assert json.loads(json_on.text) is not None


def test_acceptance_keeps_the_target_distribution() -> None:
    """Drawing the target's token with the plain step's key and accepting a point-mass draft
    iff they agree accepts ``d`` with probability p(d) and, on a rejection, emits a token that
    follows p without ``d``, renormalized: the speculative rule. 20,000 seeds."""
    p = mx.array([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = mx.broadcast_to(mx.log(p), (20000, 5))
    params = SamplingParams(temperature=1.0)
    rows = [SampleRow(params=params, seed=s, index=3) for s in range(20000)]
    targets: list[int] = sample(logits, rows).tolist()  # type: ignore[assignment]
    draft = 1
    kept = verification.accept([[9, draft]] * 20000, [t for t in targets for _ in range(2)])
    accepted = [k for k in kept if len(k) == 2]
    assert len(accepted) / 20000 == pytest.approx(0.2, abs=0.012)  # p(d)
    rejected = [k[0] for k in kept if len(k) == 1]
    rest = [0.5, 0.0, 0.15, 0.1, 0.05]
    for token, mass in enumerate(rest):
        share = rejected.count(token) / len(rejected)
        assert share == pytest.approx(mass / 0.8, abs=0.015), token


# Draft model (``--speculate draft``): the target as its own draft accepts nearly every draft;
# a 4-bit copy of it (another model, the same vocabulary) agrees with it often, not always.
# Output never changes.


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's weights quantized to 4 bits: its vocabulary, other logits."""
    from mlxd.models.maker import make_model

    out = tmp_path_factory.mktemp("draft") / "tiny-qwen3-q4"
    return make_model(out, arch="qwen3", size="tiny", quantize_bits=4, progress=lambda line: None)


def _drafting(factory: Any, draft: Path, **kw: Any) -> Any:
    return _harness(factory, "draft", draft_model=str(draft), **kw)


@pytest.mark.parametrize("one_query", [False, True], ids=["batched", "one-query"])
def test_the_target_as_its_own_draft_is_accepted_and_changes_nothing(
    harness_factory: Any, tiny_model: Path, one_query: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``one_query``: the draft catches up one query per forward, as where attention builds a
    plan per shape (CUDA)."""
    monkeypatch.setattr(attention_shapes, "PLANNED", one_query)
    outputs = {}
    for mode in ("off", "draft"):
        h = (
            _drafting(harness_factory, tiny_model)
            if mode == "draft"
            else _harness(harness_factory, "off")
        )
        for i, prompt in enumerate(PROMPTS):  # alone, then all together (the draft batched)
            h.generate(str(i), prompt, max_tokens=40, ignore_eos=True)
            h.run()
        for i, prompt in enumerate(PROMPTS):
            h.generate(f"b{i}", prompt, max_tokens=40 - 5 * i, ignore_eos=True)
        h.run()
        outputs[mode] = {k: r.token_ids for k, r in h.results.items()}
    assert outputs["draft"] == outputs["off"]
    c = h.engine.speculator.counters
    assert h.engine.speculator.mode == "draft"
    assert c.acceptance_rate > 0.95 and c.tokens_per_forward > 3, (
        c.acceptance_rate,
        c.tokens_per_forward,
    )


def test_another_draft_model_in_the_busy_batch_changes_nothing(
    harness_factory: Any, other_draft: Path
) -> None:
    off = _busy_batch(_harness(harness_factory, "off"))
    h = _drafting(harness_factory, other_draft)
    assert _busy_batch(h) == off  # greedy rows, and seeded sampled rows token for token
    c = h.engine.speculator.counters
    assert c.drafted > c.accepted > 0  # both paths of the verification ran


def test_draft_rollback_keeps_the_pool_and_the_prefix_cache_exact(
    harness_factory: Any, other_draft: Path
) -> None:
    h = _drafting(harness_factory, other_draft, num_blocks=64, block_size=4)
    h.generate("a", PROMPTS[0], max_tokens=40, ignore_eos=True)
    h.generate("b", PROMPTS[3], max_tokens=40, ignore_eos=True)
    while h.engine.scheduler.has_work():
        h.step()
        _check_blocks(h)
    sched = h.engine.scheduler
    assert sched.pool.num_used == sched.radix.num_cached_blocks
    c = h.engine.speculator.counters
    assert c.drafted > c.accepted > 0
    assert h.engine.speculator.drafter.num_rows == 0  # finished rows' draft caches are gone
    turn = h.results["a"].token_ids
    follow = _follow_up(h, turn)
    assert follow[1] > 0
    fresh = _harness(harness_factory, "off", num_blocks=64, block_size=4)
    assert _follow_up(fresh, turn)[0] == follow[0]


def test_the_draft_cache_holds_the_row_s_tokens_after_each_step(
    harness_factory: Any, other_draft: Path
) -> None:
    """Rollback of the draft's own caches: before each draft they hold exactly a prefix of the
    row's tokens (rejected drafts cut), and grow by a few tokens a step, never a re-prefill."""
    h = _drafting(harness_factory, other_draft)
    h.generate("a", PROMPTS[0], max_tokens=40, ignore_eos=True)
    drafter = h.engine.speculator.drafter
    fed = []
    real = drafter._sync

    def spy(seq: Any, row: Any) -> Any:
        assert row.caches[0].offset == len(row.tokens)  # what they hold: tokens, fed drafts
        lacking = real(seq, row)
        context = seq.prompt_ids + seq.output_ids
        assert row.tokens == context[: len(context) - lacking]  # rejected drafts cut
        assert row.caches[0].offset == len(row.tokens)
        fed.append(lacking)
        return lacking

    drafter._sync = spy
    h.run()
    assert len(fed) > 5 and max(fed[1:]) <= 9  # after its prefill a row feeds its new tokens
    assert h.engine.speculator.counters.drafted > h.engine.speculator.counters.accepted
