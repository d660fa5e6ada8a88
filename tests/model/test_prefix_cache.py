"""The paged engine on a real tiny model: prefix sharing, cache hits, eviction, preemption.

The harness checks the pool's and the prefix cache's invariants after every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxd.protocol.messages import Cancel, Generate, SamplingParams, TextPrompt, TokenPrompt
from tests.model.conftest import Result
from tests.model.test_engine import reference, reference_ids, sequences_hold_no_blocks

# The paged pool read through a view (default) or gathered every step (no view budget).
VIEW = {"view": {}, "gathered": {"max_view_tokens": 0}}

pytestmark = pytest.mark.model

SYSTEM = "You are a careful assistant. Answer briefly, in plain words, and cite nothing. " * 3
QUESTIONS = ["What is MLX?", "Why is the sky blue?", "Name three prime numbers."]


def live(h: Any, rid: str) -> Any:
    sched = h.engine.scheduler
    return next(s for s in sched.running + sched.prefilling if s.request_id == rid)


def test_concurrent_requests_share_prefix_blocks_and_a_later_one_prefills_only_its_suffix(
    harness_factory: Any,
) -> None:
    h = harness_factory(prefill_chunk=16, block_size=16)
    sched = h.engine.scheduler
    h.generate("a", SYSTEM + QUESTIONS[0], max_tokens=30, ignore_eos=True)
    h.step(20)  # a's prompt is in, its blocks are indexed
    assert h.results["a"].token_ids
    h.generate("b", SYSTEM + QUESTIONS[1], max_tokens=30, ignore_eos=True)
    h.step(1)
    a, b = live(h, "a"), live(h, "b")
    shared = [x for x, y in zip(a.block_ids, b.block_ids, strict=False) if x == y]
    assert len(shared) >= 3, "the system prompt's full blocks are held once"
    assert all(sched.pool.ref_count(x) == 3 for x in shared)  # a, b and the prefix cache
    h.run()
    cold_steps = h.results["a"].steps_to_first_token
    h.steps = 0
    h.generate("c", SYSTEM + QUESTIONS[2], max_tokens=5, ignore_eos=True)
    h.run()
    c = h.results["c"]
    assert c.finished is not None and c.finished.usage.cached_tokens >= 3 * 16
    assert c.finished.usage.cached_tokens < c.finished.usage.prompt_tokens
    # 16 prompt tokens per step: the cold prompt took several steps, the suffix one or two
    assert cold_steps >= 4 and c.steps_to_first_token <= 2, (cold_steps, c.steps_to_first_token)
    r = sched.kv_report()
    assert r.hits == 2 and r.misses == 1 and r.hit_tokens >= 2 * 3 * 16
    assert h.results["b"].finished.usage.cached_tokens > 0
    assert h.results["a"].finished.usage.cached_tokens == 0
    assert sequences_hold_no_blocks(h)


def test_outputs_are_the_same_with_and_without_prefix_hits(
    harness_factory: Any, tiny_model: Path
) -> None:
    warm = harness_factory(block_size=16)
    warm.generate("warmup", SYSTEM + "Hi.", max_tokens=4)
    warm.run()
    for i, q in enumerate(QUESTIONS):
        warm.generate(str(i), SYSTEM + q, max_tokens=12, ignore_eos=True)
    results = warm.run()
    for i, q in enumerate(QUESTIONS):
        assert results[str(i)].finished.usage.cached_tokens > 0
        assert results[str(i)].token_ids == reference(tiny_model, SYSTEM + q, 12), q


def test_multi_turn_prompt_reuses_the_previous_turn(harness_factory: Any) -> None:
    h = harness_factory(block_size=16)
    h.generate("t1", SYSTEM + QUESTIONS[0], max_tokens=20, ignore_eos=True)
    first = h.run()["t1"]
    h.generate("t2", SYSTEM + QUESTIONS[0] + first.text + " " + QUESTIONS[1], max_tokens=4)
    cached = h.run()["t2"].finished.usage.cached_tokens
    assert cached >= first.finished.usage.prompt_tokens - 16


def test_a_full_pool_evicts_cached_blocks_never_blocks_in_use(harness_factory: Any) -> None:
    # 12 blocks of 8 tokens: each prompt + output fits, but not all their blocks at once
    h = harness_factory(num_blocks=12, block_size=8, max_num_seqs=2)
    for i in range(6):
        h.generate(f"r{i}", f"{i} " * 20 + QUESTIONS[i % 3], max_tokens=6, ignore_eos=True)
    results = h.run()
    assert all(len(r.token_ids) == 6 for r in results.values())
    assert sequences_hold_no_blocks(h)
    assert h.engine.scheduler.pool.num_free + h.engine.scheduler.radix.num_cached_blocks == 12


@pytest.mark.parametrize("kv", VIEW)
def test_preemption_under_a_tiny_pool_gives_the_same_greedy_output(
    harness_factory: Any, kv: str
) -> None:
    prompts = [f"{i} " * 6 + q for i, q in enumerate(QUESTIONS * 2)]

    def run(**kw: Any) -> tuple[dict[str, list[int]], Any]:
        h = harness_factory(max_num_seqs=6, **kw, **VIEW[kv])
        for i, p in enumerate(prompts):
            h.generate(str(i), p, max_tokens=24, ignore_eos=True, seed=i)
        h.generate("sampled", prompts[0], max_tokens=24, temperature=1.0, seed=7)
        res = h.run()
        assert all(r.finished is not None for r in res.values())
        assert sequences_hold_no_blocks(h)
        return {k: r.token_ids for k, r in res.items()}, h.engine.scheduler.kv_report()

    roomy, roomy_report = run(num_blocks=256, block_size=8)
    tight, tight_report = run(num_blocks=16, block_size=8)
    assert roomy_report.preemptions == 0 and tight_report.preemptions > 0
    assert tight == roomy


def test_cancel_frees_blocks_at_once(harness_factory: Any) -> None:
    h = harness_factory(block_size=8)
    h.generate("a", SYSTEM, max_tokens=50, ignore_eos=True)
    h.step(5)
    before = h.engine.scheduler.kv_report()
    assert before.blocks_used > before.blocks_cached
    h.send(Cancel(request_id="a"))
    h.step(1)
    assert sequences_hold_no_blocks(h)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_other_architectures_through_the_paged_engine_equal_mlx_lm(
    arch: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from mlxd.models.maker import make_model
    from tests.model.conftest import Harness

    path = make_model(
        tmp_path_factory.mktemp(arch) / arch, arch=arch, size="tiny", progress=lambda _: None
    )
    h = Harness(path, block_size=8, prefill_chunk=16)
    try:
        prompts = [SYSTEM + q for q in QUESTIONS[:2]] + ["hello"]
        h.generate("0", prompts[0], max_tokens=10, ignore_eos=True)
        h.run()  # its blocks are in the prefix cache now
        for i, p in enumerate(prompts[1:], start=1):
            h.generate(str(i), p, max_tokens=10, ignore_eos=True)
        results = h.run()
        for i, p in enumerate(prompts):
            assert results[str(i)].token_ids == reference(path, p, 10), (arch, p)
        assert results["1"].finished.usage.cached_tokens > 0  # the shared system prompt
    finally:
        h.close()


def test_flush_cache_drops_unreferenced_prefix_blocks(harness_factory: Any) -> None:
    h = harness_factory(block_size=8)
    h.generate("a", SYSTEM, max_tokens=4)
    h.run()
    sched = h.engine.scheduler
    cached = sched.radix.num_cached_blocks
    assert cached > 0
    assert sched.flush_prefix_cache() == cached
    assert sched.radix.num_cached_blocks == 0 and sched.pool.num_free == sched.pool.num_blocks


@pytest.mark.parametrize("kv", VIEW)
def test_long_decodes_with_rows_leaving_and_joining_equal_mlx_lm(
    harness_factory: Any, tiny_model: Path, kv: str
) -> None:
    """Decode steps write their K/V to the decode tail, which reaches the pool every few steps,
    before each prefill, and (for rows that left) at the next flush. Greedy outputs over many
    flushes, and a later prefix hit on blocks that a departed row's decode wrote, match mlx-lm."""
    h = harness_factory(block_size=8, **VIEW[kv])
    asks = {"a": (SYSTEM + QUESTIONS[0], 45), "b": (QUESTIONS[1], 21), "c": (QUESTIONS[2], 33)}
    for rid in ("a", "b"):
        h.generate(rid, asks[rid][0], max_tokens=asks[rid][1], ignore_eos=True)
    h.step(10)
    h.generate("c", asks["c"][0], max_tokens=asks["c"][1], ignore_eos=True)  # joins mid-decode
    results = h.run()
    for rid, (prompt, n) in asks.items():
        assert results[rid].token_ids == reference(tiny_model, prompt, n), rid
    # b left while a and c decoded on: its last blocks reached the pool as a deferred write.
    # Its next turn, as token ids, hits every full block of b's prompt and output.
    b_ids = h.engine.encoder.encode(TextPrompt(text=asks["b"][0])) + results["b"].token_ids
    follow = b_ids + h.engine.encoder.encode(TextPrompt(text=" Why?"))
    h.results["d"] = Result()
    h.send(
        Generate(
            request_id="d",
            prompt=TokenPrompt(token_ids=follow),
            sampling=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        )
    )
    d = h.run()["d"]
    assert d.finished.usage.cached_tokens == len(b_ids) // 8 * 8 > len(b_ids) - 8 > 12, d
    assert d.token_ids == reference_ids(tiny_model, follow, 8)
    assert sequences_hold_no_blocks(h)


def test_identical_prompts_arriving_together_share_their_blocks(
    harness_factory: Any, tiny_model: Path
) -> None:
    """``n > 1`` choices or a burst with one system prompt: the first copy prefills, the others
    wait for it one step and then hold its blocks instead of computing them again."""
    h = harness_factory(block_size=8)
    for i in range(3):
        h.generate(str(i), SYSTEM + QUESTIONS[0], max_tokens=6, ignore_eos=True)
    h.step(3)
    seqs = [live(h, str(i)) for i in range(3)]
    shared = set(seqs[0].block_ids) & set(seqs[1].block_ids) & set(seqs[2].block_ids)
    assert len(shared) >= 3 and all(h.engine.scheduler.pool.ref_count(b) == 4 for b in shared)
    results = h.run()
    expected = reference(tiny_model, SYSTEM + QUESTIONS[0], 6)
    assert all(results[str(i)].token_ids == expected for i in range(3))
    cached = sorted(results[str(i)].finished.usage.cached_tokens for i in range(3))
    assert cached[0] == 0 and cached[1] == cached[2] >= 3 * 8, cached


def test_a_read_view_grows_or_hands_decode_back_to_the_pool_and_equals_mlx_lm(
    harness_factory: Any, tiny_model: Path
) -> None:
    """Decode reads a view of the batch's K/V that grows every 64 columns; where its budget
    does not allow growing, the batch goes on reading the pool's blocks. Both equal mlx-lm."""
    asks = {"a": QUESTIONS[0], "b": QUESTIONS[1] + " " + QUESTIONS[2]}  # different lengths
    for budget, after_first_fill in ((None, True), (200, False)):
        h = harness_factory(block_size=8, max_view_tokens=budget)
        for rid, prompt in asks.items():
            h.generate(rid, prompt, max_tokens=150, ignore_eos=True)
        h.step(10)
        tail = h.engine.runner.tail
        assert tail.view and tail.keys[0].shape[2] < tail.base + 64 + 1
        h.step(70)  # past the view's first 64 columns
        assert tail.view is after_first_fill
        results = h.run()
        gathered = h.engine.runner.gathered_steps  # /metrics' mlxd_worker_decode_gathered_steps
        assert (gathered == 0) is after_first_fill and gathered < 150
        for rid, prompt in asks.items():
            assert results[rid].token_ids == reference(tiny_model, prompt, 150), (budget, rid)


def test_decode_reads_a_view_only_within_its_budget_and_padding(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import mlx.core as mx

    from mlxd.worker.kv.decode_tail import VIEW_STEP, DecodeTail
    from mlxd.worker.kv.paged_cache import KVPool

    pool = KVPool(2, 16, 8, 2, 4, 4, mx.float32)  # 2 layers, 16 blocks of 8 tokens

    def started(positions: list[int], budget: int) -> DecodeTail:
        tables = [[2 * i, 2 * i + 1, 8 + i, 12 + i] for i in range(len(positions))]
        tail = DecodeTail(2, budget)
        tail.start(pool, tables, positions)
        return tail

    roomy = 2 * (16 + VIEW_STEP)
    assert started([12, 12], roomy).view  # one length: base is exactly it
    assert started([12, 12], roomy).base == 12
    assert started([9, 14], roomy).view and started([9, 14], roomy).base == 16
    assert not caplog.records
    over = started([12, 12], roomy - 9)
    assert not over.view and over.full  # over budget: the log says so once, with the remedy
    over.start(pool, [[0], [1]], [12, 12])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "outgrew" in said[0] and "--kv-cache-gb" in said[0]
    assert started([30, 1], 10_000).view  # a block of padding per row is the gather's too
    gathered = started([30, 1, 1, 1], 10_000)  # rows padded to over twice their tokens
    assert not gathered.view and gathered.base == 0  # the padding, not the budget:
    assert not gathered.outgrown and not gathered.full  # no warning, not counted
    assert gathered.keys[0].shape == (4, 2, 16, 4)  # the decoded tokens only, until a flush


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_schedules_decode_the_same_in_every_kv_mode(harness_factory: Any, seed: int) -> None:
    """Requests of random lengths arrive, leave and are cancelled at random steps, in a pool
    small enough to preempt: greedy outputs through the view (roomy, or a budget that forces
    hand-overs to the pool), the gathered path and the contiguous cache are the same."""
    import random

    rng = random.Random(seed)
    words = (SYSTEM + " ".join(QUESTIONS)).split()
    plan = []  # (arrival step, request id, prompt, max_tokens, cancel step or None)
    for i in range(10):
        start = rng.randrange(len(words) - 12)
        prompt = " ".join(words[start : start + rng.randrange(2, 12)])
        if rng.random() < 0.3:
            prompt = SYSTEM + prompt  # shared blocks and prefix hits
        at = rng.randrange(60)
        cancel = at + rng.randrange(3, 30) if rng.random() < 0.2 else None
        plan.append((at, str(i), prompt, rng.randrange(5, 90), cancel))

    def run(**kw: Any) -> dict[str, list[int]]:
        h = harness_factory(block_size=8, max_num_seqs=6, **kw)
        runner = h.engine.runner
        step = 0
        while step < 60 or h.engine.scheduler.has_work():
            for at, rid, prompt, n, cancel in plan:
                if at == step:
                    h.generate(rid, prompt, max_tokens=n, ignore_eos=True)
                if cancel == step:
                    h.send(Cancel(request_id=rid))
            h.step()
            if runner.rows and hasattr(runner, "tail"):
                modes.add("view" if runner.tail.view else "gathered")
            step += 1
            assert step < 3000, "engine did not finish"
        assert kw.get("paged") is False or sequences_hold_no_blocks(h)
        preempted.append(
            h.engine.scheduler.kv_report().preemptions if h.engine.scheduler.pool else 0
        )
        return {
            rid: r.token_ids
            for rid, r in h.results.items()
            if r.finished is not None and r.finished.finish_reason == "length"
        }

    modes: set[str] = set()
    preempted: list[int] = []
    expected = run(paged=False, num_blocks=256)
    assert len(expected) >= 7
    cases: list[tuple[dict[str, Any], set[str] | None]] = [
        ({}, {"view"}),
        ({"max_view_tokens": 300}, {"view", "gathered"}),  # hands over when the view is full
        ({"max_view_tokens": 0}, {"gathered"}),
        ({"num_blocks": 24}, None),  # preempts
    ]
    for kw, seen in cases:
        modes.clear()
        assert run(**kw) == expected, kw
        assert seen is None or seen <= modes, (kw, modes)
    assert preempted[-1] > 0  # the small pool preempted, and the outputs did not change
