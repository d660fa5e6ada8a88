"""Logprobs from the batched engine equal mlx-lm's for the same prompt, for the rows that ask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.model.conftest import load_model

pytestmark = pytest.mark.model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog, again and again and again and again",
    "hello world",
    "import os\n",
]


def reference(model_path: Path, prompt: str, max_tokens: int) -> list[tuple[int, Any]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, tok = load_model(model_path)
    steps = generate_step(mx.array(tok.encode(prompt)), model, max_tokens=max_tokens)
    return [(int(token), lp) for token, lp in steps]


@pytest.mark.parametrize("prefill_chunk", [16, 512], ids=["chunked", "one-batch"])
def test_logprobs_match_mlx_lm_in_a_mixed_batch(
    harness_factory: Any, tiny_model: Path, prefill_chunk: int
) -> None:
    import mlx.core as mx

    h = harness_factory(prefill_chunk=prefill_chunk)
    for i, prompt in enumerate(PROMPTS):  # the middle row does not ask
        h.generate(
            f"r{i}",
            prompt,
            max_tokens=6,
            ignore_eos=True,
            logprobs=i != 1,
            top_logprobs=3 if i == 0 else 0,
        )
    results = h.run()
    assert results["r1"].logprobs == []
    for i in (0, 2):
        got, ref = results[f"r{i}"], reference(tiny_model, PROMPTS[i], 6)
        assert got.token_ids == [t for t, _ in ref]
        assert [e.token_id for e in got.logprobs] == got.token_ids
        for entry, (token, ref_lp) in zip(got.logprobs, ref, strict=True):
            assert mx.allclose(mx.array(entry.logprob), ref_lp[token], atol=1e-4).item()
            assert len(entry.top_logprobs) == (3 if i == 0 else 0)
            if entry.top_logprobs:  # greedy: the chosen token is the best one
                assert entry.top_logprobs[0].token_id == token
                values = [t.logprob for t in entry.top_logprobs]
                assert values == sorted(values, reverse=True)


def test_logprob_token_bytes_decode_to_the_text(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate("r", "hello world", max_tokens=8, ignore_eos=True, logprobs=True)
    res = h.run()["r"]
    joined = b"".join(e.token for e in res.logprobs).decode("utf-8", "replace")
    assert joined.lstrip() == res.text.lstrip()  # mlx-lm's detokenizer drops a leading space


def test_a_tokenizer_llguidance_cannot_read_refuses_logprobs(harness_factory: Any) -> None:
    h = harness_factory()
    h.engine.encoder.tokenizer = _SlowTokenizer(h.engine.encoder.tokenizer)
    h.generate("r", "hello", max_tokens=2, logprobs=True)
    err = h.results["r"].error
    assert err is not None and err.code == "invalid_request" and err.param == "logprobs"
    h.generate("ok", "hello", max_tokens=2)  # the worker goes on serving
    assert h.run()["ok"].finished is not None


class _SlowTokenizer:
    """mlx-lm's wrapper around a tokenizer that is not a fast (Rust) one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._tokenizer = object()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
