"""Embeddings are scheduled like prompts: a step's token budget, interleaved with decode.

A large embeddings request must not stall running streams (issue #25 point 4): the engine
spends at most ``prefill_chunk`` padded tokens of embedding inputs per step, then decodes.
Work is counted in steps and tokens, not wall time, so the tests hold on a loaded machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mlxd.protocol.messages import TextPrompt
from tests.model.conftest import Harness, Result

pytestmark = pytest.mark.model

BUDGET = 32
TEXTS = [f"input {i}: " + "lorem ipsum " * (i % 5) for i in range(24)]


def _vectors(res: Result) -> np.ndarray:
    assert res.embeddings is not None, res.error
    return np.array([np.frombuffer(v, "<f4") for v in res.embeddings.embeddings])


def _record_embed_calls(h: Harness) -> list[tuple[int, int]]:
    """(step, padded tokens) of each forward the embedder makes, counted from the real call."""
    calls: list[tuple[int, int]] = []
    embedder: Any = h.engine.embedder
    embed = embedder.embed

    def recording(inputs: list[list[int]]) -> list[bytes]:
        calls.append((h.steps, max(map(len, inputs)) * len(inputs)))
        return embed(inputs)  # type: ignore[no-any-return]

    embedder.embed = recording
    return calls


def _decoding_stream(harness_factory: Any) -> Harness:
    h: Harness = harness_factory(prefill_chunk=BUDGET)
    h.generate("s", "Hello", max_tokens=200, ignore_eos=True)
    h.step(3)  # prefilled and decoding: one token per step from here on
    return h


def _alone(harness_factory: Any) -> np.ndarray:
    h: Harness = harness_factory(prefill_chunk=BUDGET)
    h.embed("alone", TEXTS)
    return _vectors(h.run()["alone"])


def test_a_stream_gets_a_token_every_step_while_embeddings_run(harness_factory: Any) -> None:
    h = _decoding_stream(harness_factory)
    h.embed("e", TEXTS)
    tokens_per_step: list[int] = []
    while h.results["e"].embeddings is None and h.results["e"].error is None:
        before = len(h.results["s"].token_ids)
        h.step()
        tokens_per_step.append(len(h.results["s"].token_ids) - before)
        assert len(tokens_per_step) < 150, "the embeddings never finished"
    usage = h.results["e"].embeddings
    assert usage is not None
    # Spread over many steps (about one budget each), and the stream never skipped one.
    assert len(tokens_per_step) >= usage.usage.prompt_tokens // BUDGET
    assert tokens_per_step == [1] * len(tokens_per_step)
    assert np.allclose(_vectors(h.results["e"]), _alone(harness_factory), atol=1e-5)


def test_embedding_work_between_two_stream_tokens_fits_one_step_budget(
    harness_factory: Any,
) -> None:
    h = _decoding_stream(harness_factory)
    calls = _record_embed_calls(h)
    arrivals: list[int] = []  # the step after which each of the stream's tokens was received
    h.embed("e", TEXTS)
    while h.results["e"].embeddings is None or not arrivals:
        before = len(h.results["s"].token_ids)
        h.step()
        arrivals += [h.steps] * (len(h.results["s"].token_ids) - before)
    assert calls, "no embedding forward ran"
    # The embedding work done in each gap between consecutive stream tokens (and before the
    # first of them): this is what stretches inter-token latency.
    gaps = zip([0, *arrivals[:-1]], arrivals, strict=True)
    work = [sum(n for step, n in calls if lo <= step < hi) for lo, hi in gaps]
    assert sum(n for _, n in calls) > 3 * BUDGET  # a request far larger than one step's budget
    assert max(work) <= BUDGET, work


def test_cancel_drops_the_rest_of_an_embeddings_request(harness_factory: Any) -> None:
    from mlxd.protocol.messages import Cancel

    h = _decoding_stream(harness_factory)
    calls = _record_embed_calls(h)
    h.embed("e", TEXTS)
    h.step()
    h.send(Cancel(request_id="e"))
    num_calls = len(calls)
    h.step(5)
    assert len(calls) == num_calls and h.results["e"].embeddings is None
    assert h.results["e"].error is None  # nothing more is sent for a cancelled request
    assert not h.engine.scheduler.embedding


def test_a_bad_embeddings_request_does_not_disturb_another(harness_factory: Any) -> None:
    from mlxd.protocol.messages import Embed, TextPrompt, TokenPrompt

    h = _decoding_stream(harness_factory)
    h.embed("good", TEXTS[:6])
    h.results["bad"] = Result()
    h.send(Embed(request_id="bad", inputs=[TextPrompt(text="ok"), TokenPrompt(token_ids=[-1])]))
    h.run()
    bad = h.results["bad"].error
    assert bad is not None and bad.param == "input[1]"
    assert np.allclose(_vectors(h.results["good"]), _alone(harness_factory)[:6], atol=1e-5)
    assert h.results["s"].finished is not None


def test_a_failing_embedding_forward_fails_only_its_request(harness_factory: Any) -> None:
    h = _decoding_stream(harness_factory)
    embedder: Any = h.engine.embedder
    embed = embedder.embed
    poison = h.engine.encoder.encode(TextPrompt(text="poison"))

    def failing(inputs: list[list[int]]) -> list[bytes]:
        if poison in inputs:  # as MLX reports a failed computation
            raise RuntimeError("[metal] command buffer failed")
        return embed(inputs)  # type: ignore[no-any-return]

    embedder.embed = failing
    # Two chunks of "bad" in one step: the long input fits what the short ones leave.
    h.embed("bad", ["aaa", "poison", "lorem ipsum dolor " * 2])
    h.embed("good", TEXTS[:6])
    h.run()
    bad = h.results["bad"]
    assert bad.error is not None and bad.error.code == "internal_error" and bad.embeddings is None
    assert np.allclose(_vectors(h.results["good"]), _alone(harness_factory)[:6], atol=1e-5)
    assert h.results["s"].finished is not None


def test_a_long_input_goes_a_piece_per_step_and_equals_it_embedded_whole(
    harness_factory: Any,
) -> None:
    h = _decoding_stream(harness_factory)
    long_text = "the long input " * 60  # about 180 tokens: six steps' budgets
    h.embed("e", ["short one", long_text, "another short one"])
    tokens_per_step: list[int] = []
    while h.results["e"].embeddings is None and h.results["e"].error is None:
        before = len(h.results["s"].token_ids)
        h.step()
        tokens_per_step.append(len(h.results["s"].token_ids) - before)
        assert len(tokens_per_step) < 50, "the embeddings never finished"
    assert len(tokens_per_step) >= 5 and tokens_per_step == [1] * len(tokens_per_step)
    ids = h.engine.encoder.encode(TextPrompt(text=long_text))
    embedder: Any = h.engine.embedder
    whole = np.frombuffer(embedder.embed([ids])[0], "<f4")
    assert np.allclose(_vectors(h.results["e"])[1], whole, atol=1e-5)
    assert not embedder._partials  # nothing kept once the input is done


def test_cancel_mid_way_through_a_long_input_forgets_it(harness_factory: Any) -> None:
    from mlxd.protocol.messages import Cancel

    h = _decoding_stream(harness_factory)
    h.embed("e", ["the long input " * 60])
    h.step(2)
    embedder: Any = h.engine.embedder
    assert embedder._partials
    h.send(Cancel(request_id="e"))
    assert not embedder._partials and not h.engine.scheduler.embedding
