"""A forward that fails inside MLX: out of device memory, the batch shrinks and every stream
goes on; any other failure errors only the requests in that step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlxd.protocol.messages import Ping
from tests.model.test_engine import KV_MODES, PROMPTS, reference, reference_ids

pytestmark = pytest.mark.model

CUDA_OOM = "cudaMallocAsync(&data, size, stream) failed: out of memory"


class FailingModel:
    """The outermost edge: the model raises as MLX does when ``fails(tokens)`` says so."""

    def __init__(self, model: Any, fails: Callable[[Any], bool], message: str) -> None:
        self.model, self.fails, self.message = model, fails, message
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, tokens: Any, cache: Any = None) -> Any:
        if self.fails(tokens):
            self.failures += 1
            raise RuntimeError(self.message)
        return self.model(tokens, cache=cache)


def decode_of(rows: int) -> Callable[[Any], bool]:
    """A decode step (one token per row) of at least ``rows`` rows."""
    return lambda tokens: tokens.shape[1] == 1 and tokens.shape[0] >= rows


def inject(h: Any, fails: Callable[[Any], bool], message: str = CUDA_OOM) -> FailingModel:
    model = FailingModel(h.engine.runner.model, fails, message)
    h.engine.runner.model = model
    return model


@pytest.mark.parametrize("kv", ["view", "contiguous"])
def test_out_of_memory_in_decode_shrinks_the_batch_and_every_stream_completes(
    harness_factory: Any, tiny_model: Path, kv: str
) -> None:
    h = harness_factory(max_num_seqs=4, **KV_MODES[kv])
    model = inject(h, decode_of(rows=2))  # only one row at a time fits
    for i, p in enumerate(PROMPTS[:4]):
        h.generate(str(i), p, max_tokens=10, ignore_eos=True)
    results = h.run()
    assert model.failures == 2  # 4 rows, then 2: the batch halves each time
    assert h.engine.scheduler.config.max_num_seqs == 1
    for i, p in enumerate(PROMPTS[:4]):
        assert results[str(i)].error is None
        assert results[str(i)].token_ids == reference(tiny_model, p, 10), p  # no token lost


def test_the_batch_grows_back_after_an_out_of_memory_error_that_passed(
    harness_factory: Any, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxd.worker.sched import oom_backoff

    monkeypatch.setattr(oom_backoff, "RECOVER_STEPS", 3)
    h = harness_factory(max_num_seqs=4)
    model = inject(h, lambda tokens: decode_of(rows=3)(tokens) and model.failures == 0)
    for i, p in enumerate(PROMPTS[:4]):
        h.generate(str(i), p, max_tokens=16, ignore_eos=True)
    results = h.run()
    assert model.failures == 1
    assert h.engine.scheduler.config.max_num_seqs == 4  # 2 after the failure, then 4 again
    for i, p in enumerate(PROMPTS[:4]):
        assert results[str(i)].token_ids == reference(tiny_model, p, 16), p


def test_out_of_memory_that_persists_errors_each_request_after_its_retries(
    harness_factory: Any,
) -> None:
    h = harness_factory(max_num_seqs=2)
    inject(h, decode_of(rows=1))
    h.generate("a", PROMPTS[0], max_tokens=10, ignore_eos=True)
    h.generate("b", PROMPTS[1], max_tokens=10, ignore_eos=True)
    results = h.run()
    for rid in "ab":
        assert results[rid].error is not None and results[rid].error.code == "out_of_memory"
        assert results[rid].finished is None
    assert h.engine.runner.rows == [] and not h.engine.scheduler.has_work()


def test_other_failures_error_that_step_only_and_the_engine_goes_on(
    harness_factory: Any, tiny_model: Path
) -> None:
    h = harness_factory(max_num_seqs=8)
    model = inject(h, decode_of(rows=1), message="[gather] invalid index")
    h.generate("bad", PROMPTS[0], max_tokens=10, ignore_eos=True)
    h.run()
    assert h.results["bad"].error is not None and h.results["bad"].error.code == "internal_error"
    assert model.failures == 1 and h.engine.scheduler.config.max_num_seqs == 8  # not retried
    model.fails = lambda tokens: False
    h.generate("next", PROMPTS[2], max_tokens=6, ignore_eos=True)
    assert h.run()["next"].token_ids == reference(tiny_model, PROMPTS[2], 6)


def test_a_failed_step_keeps_the_tokens_of_rows_that_left_before_it(
    harness_factory: Any, tiny_model: Path
) -> None:
    """A row that finished hands its decoded tokens to the next flush and its blocks to the
    prefix cache; a later failed step must not lose that write, or a request continuing the
    finished one reads blocks that were never filled."""
    from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt
    from tests.model.conftest import Result, load_model

    h = harness_factory(block_size=16)
    model = inject(h, lambda tokens: False)
    h.generate("a", PROMPTS[1], max_tokens=20, ignore_eos=True)  # 24 + 20 tokens: 2 full blocks
    h.generate("b", PROMPTS[1], max_tokens=40, ignore_eos=True)  # goes on decoding after "a"
    while h.results["a"].finished is None:
        h.step()
    model.fails = lambda tokens: tokens.shape[1] == 1 and model.failures == 0
    h.run()
    assert model.failures == 1 and h.results["b"].error is None
    ids = load_model(tiny_model)[1].encode(PROMPTS[1]) + h.results["a"].token_ids
    h.results["c"] = Result()
    sampling = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    h.send(Generate(request_id="c", prompt=TokenPrompt(token_ids=ids), sampling=sampling))
    results = h.run()
    finished = results["c"].finished
    assert finished is not None and finished.usage.cached_tokens == 32  # "a"'s decoded tokens too
    assert results["c"].token_ids == reference_ids(tiny_model, ids, 8)


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_steps_that_all_fail_make_the_worker_say_it_is_failing_until_one_succeeds(
    harness_factory: Any, step: str
) -> None:
    from mlxd.worker.engine import MAX_FAILED_STEPS

    h = harness_factory(max_num_seqs=4)
    fails = (lambda tokens: True) if step == "prefill" else decode_of(rows=1)
    model = inject(h, fails, message="[metal] device lost")
    for i in range(MAX_FAILED_STEPS):
        assert h.engine.pong(Ping(request_id="p")).failing == ""  # one bad request is no failure
        h.generate(str(i), PROMPTS[i % len(PROMPTS)], max_tokens=4, ignore_eos=True)
        assert h.run()[str(i)].error is not None
    failing = h.engine.pong(Ping(request_id="p")).failing
    assert f"last {MAX_FAILED_STEPS} steps failed" in failing and "device lost" in failing
    model.fails = lambda tokens: False
    h.generate("ok", PROMPTS[0], max_tokens=4)
    assert h.run()["ok"].error is None
    assert h.engine.pong(Ping(request_id="p")).failing == ""


def test_out_of_memory_that_a_smaller_batch_may_fix_is_no_failing_step(
    harness_factory: Any,
) -> None:
    h = harness_factory(max_num_seqs=8)
    model = inject(h, decode_of(rows=2))  # only one row at a time fits
    for i in range(8):
        h.generate(str(i), PROMPTS[i % len(PROMPTS)], max_tokens=4, ignore_eos=True)
    while model.failures == 0:
        h.step()
    assert h.engine.num_failed_steps == 0  # the batch shrank: the next step may well succeed
    h.run()
    assert model.failures >= 2 and all(r.error is None for r in h.results.values())
    assert h.engine.pong(Ping(request_id="p")).failing == ""
