"""The batching engine on a real tiny model: batched output equals one-at-a-time output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxd.protocol.messages import Cancel
from tests.model.conftest import load_model

pytestmark = pytest.mark.model

# How decode reads K/V: the paged pool through a read view (default), the pool's blocks gathered
# every step (no view budget), or the contiguous cache.
KV_MODES = {"view": {}, "gathered": {"max_view_tokens": 0}, "contiguous": {"paged": False}}

PROMPTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog, again and again and again",
    "a",
    "Python is a programming language that lets you work quickly",
    "import os\nimport sys\n",
]


def reference(model_path: Path, prompt: str, max_tokens: int) -> list[int]:
    _, tok = load_model(model_path)
    return reference_ids(model_path, tok.encode(prompt), max_tokens)


def reference_ids(model_path: Path, ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's greedy tokens after the prompt ``ids`` (``generate_step``, one sequence)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, _ = load_model(model_path)
    out = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        out.append(int(token))
    return out


def sequences_hold_no_blocks(h: Any) -> bool:
    """Every block still in use is held by the prefix cache alone."""
    pool = h.engine.scheduler.pool
    return all(pool.ref_count(b) <= 1 for b in range(pool.num_blocks)) and (
        pool.num_used == h.engine.scheduler.radix.num_cached_blocks
    )


@pytest.mark.parametrize("kv", KV_MODES)
@pytest.mark.parametrize("prefill_chunk", [16, 512], ids=["chunked", "one-padded-batch"])
def test_batched_greedy_equals_single_mlx_lm(
    harness_factory: Any, tiny_model: Path, prefill_chunk: int, kv: str
) -> None:
    h = harness_factory(prefill_chunk=prefill_chunk, **KV_MODES[kv])
    for i, p in enumerate(PROMPTS):
        h.generate(str(i), p, max_tokens=12, ignore_eos=True)
    results = h.run()
    for i, p in enumerate(PROMPTS):
        assert results[str(i)].token_ids == reference(tiny_model, p, 12), p


@pytest.mark.parametrize("kv", KV_MODES)
def test_rows_of_one_length_decode_unmasked_and_equal_mlx_lm(
    harness_factory: Any, tiny_model: Path, kv: str
) -> None:
    """Rows with as many tokens each attend without a mask (the fused kernel's case)."""
    h = harness_factory(block_size=16, **KV_MODES[kv])  # 24 prompt tokens: a partial block
    for i in range(3):
        h.generate(str(i), PROMPTS[1], max_tokens=20, ignore_eos=True)
    results = h.run()
    expected = reference(tiny_model, PROMPTS[1], 20)
    assert all(results[str(i)].token_ids == expected for i in range(3))


def test_join_mid_generation_gets_tokens_before_others_finish(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate("long", PROMPTS[1], max_tokens=40, ignore_eos=True)
    h.step(5)
    h.generate("late", PROMPTS[0], max_tokens=3, ignore_eos=True)
    h.step(2)
    assert h.results["late"].token_ids, "the late request should already be streaming"
    assert h.results["long"].finished is None
    results = h.run()
    assert results["late"].finished is not None and len(results["late"].token_ids) == 3
    assert len(results["long"].token_ids) == 40


def test_seeded_sampling_is_reproducible_in_any_batch(harness_factory: Any) -> None:
    sampling = {
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 1234,
        "max_tokens": 16,
        "ignore_eos": True,
    }
    alone = harness_factory()
    alone.generate("s", PROMPTS[3], **sampling)
    busy = harness_factory()
    busy.generate("x", PROMPTS[1], temperature=1.0, max_tokens=20, ignore_eos=True)
    busy.step(3)
    busy.generate("s", PROMPTS[3], **sampling)
    busy.generate("y", PROMPTS[0], temperature=0.7, max_tokens=5, ignore_eos=True)
    assert alone.run()["s"].token_ids == busy.run()["s"].token_ids


def test_cancel_stops_one_stream_and_frees_its_slot(harness_factory: Any) -> None:
    h = harness_factory(max_num_seqs=2)
    h.generate("a", PROMPTS[0], max_tokens=30, ignore_eos=True)
    h.generate("b", PROMPTS[1], max_tokens=30, ignore_eos=True)
    h.step(4)
    h.generate("c", PROMPTS[2], max_tokens=5, ignore_eos=True)
    h.step(2)
    assert not h.results["c"].token_ids, "no slot for c while a and b run"
    sent_before = len(h.results["a"].token_ids)
    h.send(Cancel(request_id="a"))
    results = h.run()
    assert results["a"].finished is None and results["a"].error is None
    assert len(results["a"].token_ids) <= sent_before + 1
    assert len(results["b"].token_ids) == 30 and len(results["c"].token_ids) == 5
    assert h.engine.runner.rows == [] and sequences_hold_no_blocks(h)


def test_queue_flood_is_refused_with_overloaded(harness_factory: Any) -> None:
    h = harness_factory(max_num_seqs=1, max_queued=2)
    h.generate("0", PROMPTS[0], max_tokens=2)
    h.step()  # "0" is admitted; the queue is empty again
    for i in range(1, 6):
        h.generate(str(i), PROMPTS[0], max_tokens=2)
    results = h.run()
    refused = [rid for rid, r in results.items() if r.error is not None]
    done = [rid for rid, r in results.items() if r.finished is not None]
    assert refused == ["3", "4", "5"]
    assert all(results[rid].error.code == "overloaded" for rid in refused)  # type: ignore[union-attr]
    assert done == ["0", "1", "2"]


def test_stop_string_and_length_finish_reasons(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate("free", PROMPTS[3], max_tokens=12, ignore_eos=True)
    free = h.run()["free"]
    stop = free.text[len(free.text) // 2 :][:3]
    h.generate("stopped", PROMPTS[3], max_tokens=12, ignore_eos=True, stop=[stop])
    stopped = h.run()["stopped"]
    assert free.finished is not None and free.finished.finish_reason == "length"
    assert stopped.finished is not None and stopped.finished.finish_reason == "stop"
    assert stop not in stopped.text and free.text.startswith(stopped.text)


def test_bad_sampling_errors_only_that_request(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate("ok", PROMPTS[0], max_tokens=4)
    h.generate("bad", PROMPTS[0], max_tokens=4, top_p=1.5)
    h.generate("long", PROMPTS[0], max_tokens=10_000)
    results = h.run()
    assert results["bad"].error is not None and results["bad"].error.param == "top_p"
    assert results["long"].error is not None and results["long"].error.param == "max_tokens"
    assert results["ok"].finished is not None


def test_penalised_request_is_the_same_alone_and_in_a_batch(harness_factory: Any) -> None:
    sampling = {
        "max_tokens": 10,
        "ignore_eos": True,
        "repetition_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
    }
    alone = harness_factory()
    alone.generate("p", PROMPTS[4], **sampling)
    busy = harness_factory()
    busy.generate("x", PROMPTS[1], max_tokens=12, ignore_eos=True)
    busy.step(2)
    busy.generate("p", PROMPTS[4], **sampling)
    busy.generate("b", PROMPTS[2], max_tokens=4, ignore_eos=True, logit_bias={7: 100.0})
    assert alone.run()["p"].token_ids == busy.run()["p"].token_ids
    assert busy.results["b"].token_ids == [7, 7, 7, 7]


def test_low_priority_is_served_behind_a_stream_of_high_priority(harness_factory: Any) -> None:
    now = [0.0]
    h = harness_factory(clock=lambda: now[0], max_num_seqs=1, aging_s=1.0)
    h.send(_generate("low", priority="low", at=now))
    h.send(_generate("high0", priority="high", at=now))
    order: list[str] = []
    for _ in range(500):  # each time one finishes, time passes and a new high one arrives
        h.step()
        for rid, r in h.results.items():
            if r.finished is not None and rid not in order:
                order.append(rid)
                now[0] += 0.5
                h.send(_generate(f"high{len(order)}", priority="high", at=now))
        if "low" in order:
            break
    assert "low" in order, "aging must let the low-priority request in"
    assert order.index("low") >= 3, order  # high ones went first while it was young


def _generate(rid: str, priority: str, at: list[float]) -> Any:
    from mlxd.protocol.messages import Generate, SamplingParams, TextPrompt

    return Generate(
        request_id=rid,
        prompt=TextPrompt(text="hi"),
        priority=priority,
        sampling=SamplingParams(max_tokens=2, temperature=0.0),
    )


def test_rows_leaving_one_by_one_hold_no_copies_of_the_view(harness_factory: Any) -> None:
    """Rows that finish between two flushes keep only their own unflushed tokens, not the
    decode view they were cut from (each such view is all the batch's K/V)."""
    import mlx.core as mx

    from mlxd.worker.kv.decode_tail import VIEW_STEP
    from mlxd.worker.kv.paged_cache import KVPool

    h = harness_factory(num_blocks=512, max_num_seqs=24, max_queued=24)
    n = 24
    for i in range(n):  # one prompt length, so the batch decodes through a view
        h.generate(str(i), "hello world " * 8, max_tokens=8 + 2 * i, ignore_eos=True)
    while len(h.engine.runner.rows) < n:
        h.step()
    tail = h.engine.runner.tail
    h.step()
    assert tail.view
    view_bytes = n * (tail.base + VIEW_STEP) * KVPool.bytes_per_token(h.engine.runner.model)
    mx.eval(h.engine.runner.pool.keys)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    h.run()  # a row leaves every other step, all within one view
    assert all(r.finished for r in h.results.values())
    assert mx.get_peak_memory() - before < 2 * view_bytes


def test_a_long_decode_holds_one_view_not_one_per_flush(harness_factory: Any) -> None:
    """Flushes write the pool while the batch keeps decoding through its view: the writes are
    done then, and do not keep each flush's view alive until the batch changes."""
    import mlx.core as mx

    from mlxd.worker.kv.decode_tail import VIEW_STEP
    from mlxd.worker.kv.paged_cache import KVPool

    h = harness_factory(num_blocks=512, max_num_seqs=8, max_queued=8)
    n, out = 8, 6 * VIEW_STEP
    for i in range(n):  # no request joins or leaves: one batch, one view, many flushes
        h.generate(str(i), "hello world " * 8, max_tokens=out, ignore_eos=True)
    while len(h.engine.runner.rows) < n:
        h.step()
    tail = h.engine.runner.tail
    h.step()
    assert tail.view
    mx.eval(h.engine.runner.pool.keys)
    before = mx.get_active_memory()
    final_view = n * (tail.base + out + VIEW_STEP) * KVPool.bytes_per_token(h.engine.runner.model)
    most = 0
    while h.engine.runner.rows and tail.view:
        h.step()
        most = max(most, mx.get_active_memory() - before)
    assert all(r.finished for r in h.results.values())
    assert most < 1.5 * final_view  # one view at a time (3x when each flush kept its own)


def test_prompts_that_end_at_their_first_token_leave_no_pending_pool_writes(
    harness_factory: Any,
) -> None:
    """New prompts write the pool without reading it back; requests that need no decode step
    must not leave those writes pending, each holding its prompt's K/V, one on top of the
    other."""
    import mlx.core as mx

    from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt
    from mlxd.worker.kv.paged_cache import KVPool
    from tests.model.conftest import Result

    h = harness_factory(num_blocks=512, max_num_seqs=4, max_queued=64)
    prompt = [10 + i % 500 for i in range(256)]

    def first_token_only(rid: str, ids: list[int]) -> None:
        h.results[rid] = Result()
        h.send(
            Generate(
                request_id=rid,
                prompt=TokenPrompt(token_ids=ids),
                sampling=SamplingParams(max_tokens=1, temperature=0.0),
            )
        )
        h.run()

    first_token_only("warm", prompt)
    mx.eval(h.engine.runner.pool.keys, h.engine.runner.pool.values)
    before = mx.get_active_memory()
    for i in range(32):
        first_token_only(str(i), [t + i for t in prompt])
    kv = len(prompt) * KVPool.bytes_per_token(h.engine.runner.model)
    assert mx.get_active_memory() - before < 4 * kv  # 32 prompts' K/V would be 32x


@pytest.mark.parametrize("kv", KV_MODES)
def test_the_first_token_is_computed_as_mlx_lm_computes_it(
    harness_factory: Any, tiny_model: Path, kv: str
) -> None:
    """The prompt's last token runs in a one-query forward after the rest, as mlx-lm's
    generate feeds it: the first token's log probabilities are mlx-lm's to the bit, not those
    of a forward over the whole prompt (on a GPU in half precision the two pick different
    tokens at near-ties: docs/PERFORMANCE.md, fidelity)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, tok = load_model(tiny_model)
    ids = tok.encode(PROMPTS[1])

    def first_logprobs(split: bool) -> list[float]:
        cache = make_prompt_cache(model)
        logits = model(mx.array([ids[:-1] if split else ids]), cache=cache)[:, -1]
        if split:
            logits = model(mx.array([ids[-1:]]), cache=cache)[:, -1]
        logits = logits.astype(mx.float32)
        return (logits - mx.logsumexp(logits, axis=-1, keepdims=True))[0].tolist()  # type: ignore[no-any-return]

    split, whole = first_logprobs(True), first_logprobs(False)
    h = harness_factory(**KV_MODES[kv])
    h.generate("r", PROMPTS[1], max_tokens=1, logprobs=True, top_logprobs=5)
    first = h.run()["r"].logprobs[0]
    got = [t.logprob for t in first.top_logprobs]
    top = sorted(range(len(split)), key=lambda i: -split[i])[:5]
    assert [t.token_id for t in first.top_logprobs] == top
    assert got == [split[i] for i in top]
    if any(split[i] != whole[i] for i in top):  # with OpenBLAS here; the reference BLAS rounds
        assert got != [whole[i] for i in top]  # the two alike, and nothing tells them apart
