"""Hybrids on the block pool (``runners.hybrid``): attention layers paged, recurrent state by row,
snapshots of it on the prefix cache's nodes at block boundaries. Every output is checked
against mlx-lm's own greedy tokens for the same prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.nn as nn
import pytest

from mlxd.models.maker import make_model
from mlxd.models.zoo import make_zoo_model
from tests.model.conftest import Harness
from tests.model.test_engine import PROMPTS, reference_ids

# The snapshot runner's contract, collected here too with this module's hybrids: the second
# prompt sharing blocks with the cache snapshots where they part, later ones hit there.
from tests.model.test_prefix_snapshots import (  # noqa: F401
    test_prompts_sharing_a_system_prompt_hit_it_whatever_follows,
)

pytestmark = pytest.mark.model

BLOCK = 16
LONG = PROMPTS[1] * 3  # several blocks


# LFM2 (short convolutions) and Qwen3-Next (Gated DeltaNet, gated attention)
@pytest.fixture(scope="module", params=["lfm2", "qwen3_next"])
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "m"
    if request.param == "lfm2":
        return make_model(out, arch="lfm2", size="tiny", progress=lambda line: None)
    return make_zoo_model(out, request.param)


def test_a_hybrid_is_served_on_the_pool(model_path: Path) -> None:
    from mlxd.worker.runners.hybrid import HybridModelRunner
    from mlxd.worker.runners.short_conv import TapsConv1d

    h = Harness(model_path, block_size=BLOCK)
    try:
        assert isinstance(h.engine.runner, HybridModelRunner)
        assert h.engine.runner.kv_description.startswith("paged")
        assert not h.engine.runner.speculates  # a rejected draft would have moved the state
        # its short convolutions as the worker runs them: this module's outputs, checked
        # against mlx-lm's (``nn.Conv1d``), are the multiply-adds' (``runners.short_conv``)
        modules = [m for _, m in h.engine.runner.model.named_modules()]
        assert any(type(m) is TapsConv1d for m in modules)
        assert not any(type(m) is nn.Conv1d for m in modules)
    finally:
        h.close()


def test_a_repeated_prompt_hits_its_last_block_and_continues_as_cold(model_path: Path) -> None:
    h = Harness(model_path, block_size=BLOCK)
    try:
        ids = h.engine.encoder.tokenizer.encode(LONG)
        cold = h.run_alone("cold", ids)
        hit = h.run_alone("hit", ids)
        assert h.engine.scheduler.flush_prefix_cache() > 0  # mlxd worker flush-cache
        assert h.engine.scheduler.radix.state_bytes == 0  # states go with their blocks
        flushed = h.run_alone("flushed", ids)
        h.engine.scheduler.check_invariants()
    finally:
        h.close()
    assert cold.finished.usage.cached_tokens == 0
    assert hit.finished.usage.cached_tokens == (len(ids) - 1) // BLOCK * BLOCK > 0
    assert hit.token_ids == cold.token_ids == reference_ids(model_path, ids, 12)
    assert flushed.finished.usage.cached_tokens == 0
    assert flushed.token_ids == cold.token_ids


def test_the_next_turn_hits_past_the_previous_prompt(model_path: Path) -> None:
    """Decode snapshots each row at the block boundaries it passes; a finished sequence hands
    its last one to the prefix cache, so the next turn (prompt, answer, more) hits inside the
    answer, not only at the first prompt's end."""
    h = Harness(model_path, block_size=BLOCK)
    try:
        first = h.engine.encoder.tokenizer.encode(PROMPTS[3])
        turn1 = h.run_alone("1", first, max_tokens=2 * BLOCK)
        second = first + turn1.token_ids + [40, 41, 42]
        turn2 = h.run_alone("2", second)
    finally:
        h.close()
    fed = len(first) + len(turn1.token_ids) - 1  # the last answer token was never fed
    assert turn2.finished.usage.cached_tokens == fed // BLOCK * BLOCK > len(first)
    assert turn2.token_ids == reference_ids(model_path, second, 12)


def test_states_stay_within_their_budget_least_recently_used_first(model_path: Path) -> None:
    """With room for one snapshot, the next prompt's replaces the first: the first prompt's
    blocks are still cached but useless without a state, so its repeat misses."""
    h = Harness(model_path, block_size=BLOCK)
    try:
        tok = h.engine.encoder.tokenizer
        radix = h.engine.scheduler.radix
        a, b = tok.encode(LONG), tok.encode(PROMPTS[3] * 3)
        h.run_alone("a", a, max_tokens=2)
        radix.state_budget = radix.state_bytes  # one snapshot, the one held
        h.run_alone("b", b, max_tokens=2)
        assert 0 < radix.state_bytes <= radix.state_budget
        again_b = h.run_alone("again b", b, max_tokens=2)
        again_a = h.run_alone("again a", a, max_tokens=2)
        h.engine.scheduler.check_invariants()
    finally:
        h.close()
    assert again_a.finished.usage.cached_tokens == 0
    assert again_b.finished.usage.cached_tokens == (len(b) - 1) // BLOCK * BLOCK


def test_batched_and_preempted_rows_equal_mlx_lm(model_path: Path) -> None:
    """Four prompts at once in a pool too small for all of them: rows are preempted, resume
    from their snapshots, and every output equals mlx-lm's alone."""
    h = Harness(model_path, block_size=BLOCK, num_blocks=12)
    try:
        tok = h.engine.encoder.tokenizer
        prompts = [tok.encode(p * 2) for p in PROMPTS[:4]]
        outputs = h.run_together(prompts, max_tokens=40)
        preemptions = h.engine.scheduler.counters.preemptions
        h.engine.scheduler.check_invariants()
    finally:
        h.close()
    assert preemptions > 0
    for i, ids in enumerate(prompts):
        assert outputs[i] == reference_ids(model_path, ids, 40), i


def test_a_wave_sharing_a_system_prompt_computes_it_once(model_path: Path) -> None:
    """Prompts that arrive together with one system prompt: the first computes it and
    snapshots where the others part from it (they wait for it), so each of them hits it."""
    from tests.model.conftest import Result

    h = Harness(model_path, block_size=BLOCK)
    try:
        system = h.engine.encoder.tokenizer.encode(LONG)[: 3 * BLOCK + 5]
        prompts = [system + list(range(q, q + BLOCK + 4)) for q in (100, 200, 300, 400)]
        for i, ids in enumerate(prompts):
            h.results[str(i)] = Result()
            h.generate_ids(str(i), ids, max_tokens=8, ignore_eos=True)
        out = h.run()
    finally:
        h.close()
    cached = sorted(out[str(i)].finished.usage.cached_tokens for i in range(4))
    assert cached == [0] + [3 * BLOCK] * 3
    for i, ids in enumerate(prompts):
        assert out[str(i)].token_ids == reference_ids(model_path, ids, 8), i


def test_a_prompt_parting_from_an_earlier_one_hits_a_periodic_snapshot(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill snapshots every STATE_EVERY tokens: a later prompt that shares more than that
    with an earlier one, and parts from it where nothing was asked for, still hits."""
    from mlxd.worker.prefix import radix_cache

    monkeypatch.setattr(radix_cache, "STATE_EVERY", 2 * BLOCK)
    h = Harness(model_path, block_size=BLOCK)
    try:
        ids = h.engine.encoder.tokenizer.encode(LONG)
        h.run_alone("first", ids, max_tokens=2)
        other = ids[: 2 * BLOCK + 7] + [5, 6, 7, 8, 9]
        parted = h.run_alone("parted", other)
    finally:
        h.close()
    assert parted.finished.usage.cached_tokens == 2 * BLOCK
    assert parted.token_ids == reference_ids(model_path, other, 12)


def test_a_failed_decode_step_leaves_a_prompt_mid_prefill_exact(model_path: Path) -> None:
    """Out of memory in a decode step while a long prompt is between its chunks: the decode
    rows are computed again, and the prompt continues from its own state (not a stale one)."""
    from tests.model.conftest import Result
    from tests.model.test_step_failures import CUDA_OOM, inject

    h = Harness(model_path, block_size=BLOCK, prefill_chunk=BLOCK)
    fired: list[bool] = []

    def once_while_prefilling(tokens: Any) -> bool:
        prefilling = [s.request_id for s in h.engine.scheduler.prefilling]
        if tokens.shape[1] == 1 and "long" in prefilling and not fired:
            fired.append(True)
            return True
        return False

    try:
        tok = h.engine.encoder.tokenizer
        short, long = tok.encode(PROMPTS[3]), tok.encode(LONG)
        inject(h, once_while_prefilling, CUDA_OOM)
        h.results["short"], h.results["long"] = Result(), Result()
        h.generate_ids("short", short, max_tokens=30, ignore_eos=True)
        h.step(3)
        h.generate_ids("long", long, max_tokens=8, ignore_eos=True)
        out = h.run()
    finally:
        h.close()
    assert fired
    assert out["long"].token_ids == reference_ids(model_path, long, 8)
    assert out["short"].token_ids == reference_ids(model_path, short, 30)


def test_one_token_prompts_joining_a_running_batch(model_path: Path) -> None:
    """Rows whose prefill computed nothing (a one-token prompt: its token runs in the decode
    step) join a batch already decoding, two in one step."""
    from tests.model.conftest import Result

    h = Harness(model_path, block_size=BLOCK)
    try:
        first = h.engine.encoder.tokenizer.encode(PROMPTS[3])
        h.results["a"] = Result()
        h.generate_ids("a", first, max_tokens=20, ignore_eos=True)
        h.step(3)
        for rid, token in (("x", 5), ("y", 9)):
            h.results[rid] = Result()
            h.generate_ids(rid, [token], max_tokens=8, ignore_eos=True)
        out = h.run()
    finally:
        h.close()
    assert out["a"].token_ids == reference_ids(model_path, first, 20)
    assert out["x"].token_ids == reference_ids(model_path, [5], 8)
    assert out["y"].token_ids == reference_ids(model_path, [9], 8)


def test_a_long_prefill_hands_its_snapshots_to_the_cache_as_it_goes(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshots every STATE_EVERY tokens go to the prefix cache with each chunk (within its
    budget), not kept on the sequence until its prompt is done."""
    from mlxd.worker.prefix import radix_cache
    from tests.model.conftest import Result

    monkeypatch.setattr(radix_cache, "STATE_EVERY", BLOCK)
    h = Harness(model_path, block_size=BLOCK, prefill_chunk=2 * BLOCK)
    held = []
    try:
        ids = h.engine.encoder.tokenizer.encode(LONG * 3)
        h.results["long"] = Result()
        h.generate_ids("long", ids, max_tokens=2, ignore_eos=True)
        for _ in range(len(ids) // (2 * BLOCK) + 4):
            h.step()
            held += [len(s.states) for s in h.engine.runner.sequences()]
        out = h.run()
        radix = h.engine.scheduler.radix
        assert radix.state_bytes > 0
        radix.check_invariants()
    finally:
        h.close()
    assert max(held) <= 2  # one chunk's cuts at most
    assert out["long"].token_ids == reference_ids(model_path, ids, 2)


def test_the_kv_budget_holds_every_rows_state_and_the_snapshots(model_path: Path) -> None:
    """A worker's KV budget for a hybrid: a quarter for the prefix cache's snapshots, each
    possible row's live state and latest snapshot, then the pool and decode's view."""
    from mlxd.config import STATE_SHARE, CacheConfig, SchedulerConfig, WorkerConfig, split_kv_budget
    from mlxd.worker.build import build_runner
    from mlxd.worker.kv import layer_caches
    from mlxd.worker.kv.paged_cache import KVPool
    from tests.model.conftest import load_model

    model, _ = load_model(model_path)
    budget = 2**20

    def blocks(rows: int) -> tuple[int, int]:
        config = WorkerConfig(
            model=str(model_path),
            name="h",
            endpoint="ipc:///tmp/h",
            cache=CacheConfig(kv_cache_gb=budget / 2**30, block_size=BLOCK),
            scheduler=SchedulerConfig(max_num_seqs=rows),
        )
        runner, pool, _ = build_runner(model, {0}, config, 1 << 16)
        assert pool is not None
        return pool.num_blocks, runner.state_budget  # type: ignore[attr-defined]

    per_row = layer_caches.state_bytes(model)
    for rows in (1, 8):
        reserved = int(budget * STATE_SHARE) + 2 * rows * per_row
        expected = split_kv_budget(budget - reserved, KVPool.bytes_per_token(model), BLOCK)[0]
        assert blocks(rows) == (expected, int(budget * STATE_SHARE))
    assert blocks(8)[0] < blocks(1)[0]


def test_queries_padded_inside_attention_leave_every_output_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where attention plans are built per shape (CUDA), a hybrid's exact spans reach attention
    with queries padded to the planned lengths (``attention_shapes.install``): batched and
    preempted rows still equal mlx-lm's alone, and no multi-query call has other lengths of
    queries or keys.
    Four layers, so an attention layer's output feeds the next layers' (in the two-layer zoo
    model the last layer is the attention, whose prefill output nothing reads)."""
    import mlx.core as mx

    from mlxd.models.maker import write_model
    from mlxd.models.zoo import zoo_config
    from mlxd.worker.kv import attention_shapes

    config = {**zoo_config("qwen3_next"), "num_hidden_layers": 4}
    model_path = write_model(tmp_path / "m", config, seed=0, progress=lambda line: None)

    tok_prompts = [PROMPTS[2] * 2, PROMPTS[0], PROMPTS[3] * 3]
    h0 = Harness(model_path, block_size=BLOCK)
    prompts = [h0.engine.encoder.tokenizer.encode(p) for p in tok_prompts]
    h0.close()
    expected = [reference_ids(model_path, ids, 24) for ids in prompts]
    seen: list[int] = []
    exact = mx.fast.scaled_dot_product_attention

    def recording(q: mx.array, k: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if isinstance(kwargs.get("mask"), mx.array) and q.shape[-2] > 1:
            seen.extend([q.shape[-2], k.shape[-2]])
        return exact(q, k, *args, **kwargs)

    monkeypatch.setattr(attention_shapes, "BUCKETED", True)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", recording)
    assert attention_shapes.install()
    h = Harness(model_path, block_size=BLOCK, num_blocks=12)
    try:
        outputs = h.run_together(prompts, max_tokens=24)
    finally:
        h.close()
    assert outputs == expected
    assert seen and all(attention_shapes.queries(n) == n for n in seen)


@pytest.mark.parametrize("arch", ["qwen3_next", "olmo_hybrid"])
def test_a_rounds_spans_of_several_lengths_share_one_padded_forward(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts of different lengths arriving together: where the recurrent layers take the
    caches' ``lengths`` (Qwen3-Next), a round's spans of one rounded length go in one forward,
    padded after the shorter ones' tokens, and every output still equals mlx-lm's alone; where
    they do not (OLMo hybrid's), only spans of one length share a forward."""
    from mlxd.worker.runners.hybrid import HybridModelRunner

    model_path = make_zoo_model(tmp_path / arch, arch)
    forwards: list[list[int]] = []
    run = HybridModelRunner._run

    def counted(self: HybridModelRunner, spans: list[Any]) -> None:
        forwards.append([s.stop - s.start for s in spans])
        run(self, spans)

    monkeypatch.setattr(HybridModelRunner, "_run", counted)
    h = Harness(model_path, block_size=BLOCK)
    try:
        pads = h.engine.runner.pads_spans
        tok = h.engine.encoder.tokenizer
        ids = tok.encode(LONG)
        prompts = [ids[:n] for n in (43, 45, 47, 60)]  # tails past their last block: 10-14, 11
        outputs = h.run_together(prompts)
    finally:
        h.close()
    assert pads == (arch == "qwen3_next")
    mixed = [f for f in forwards if len(set(f)) > 1]
    assert bool(mixed) == pads  # several lengths in one forward only where padding is taken
    for i, ids in enumerate(prompts):
        assert outputs[i] == reference_ids(model_path, ids, 12), i


def test_snapshots_follow_the_pool_the_runner_holds(model_path: Path) -> None:
    """A large budget lets snapshots take a quarter of it, but at a given moment only their
    share beside the pool's arrays as they are, at least ``STATE_FLOOR``: their memory follows
    the load as the pool's does (run S1: they had grown a soak's worker by 17 GB)."""
    from mlxd.config import STATE_FLOOR, CacheConfig, SchedulerConfig, WorkerConfig
    from mlxd.worker.build import build_runner
    from mlxd.worker.sched.scheduler import Scheduler
    from tests.model.conftest import load_model

    model, _ = load_model(model_path)
    config = WorkerConfig(
        model=str(model_path), name="h", endpoint="ipc:///tmp/h", cache=CacheConfig(kv_cache_gb=64)
    )
    runner, pool, _ = build_runner(model, {0}, config, 1 << 16)
    scheduler = Scheduler(SchedulerConfig(), pool=pool)
    runner.fit_scheduler(scheduler)
    assert scheduler.radix is not None and runner.state_budget == 16 * 2**30  # type: ignore[attr-defined]
    assert scheduler.radix.state_limit == STATE_FLOOR
