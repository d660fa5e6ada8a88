"""logprobs through the official openai client: present, consistent with greedy choice."""

from __future__ import annotations

import math

import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture
def daemon(shared_daemon: Daemon) -> Daemon:
    return shared_daemon


MESSAGES = [{"role": "user", "content": "Tell me about the python standard library"}]


def test_chat_logprobs_are_consistent_with_greedy_choice(daemon: Daemon) -> None:
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = resp.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == resp.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert len(entry.top_logprobs) == 3
        best = entry.top_logprobs[0]
        assert (best.token, best.logprob) == (entry.token, entry.logprob)
        assert (
            entry.logprob <= 0
            and bytes(entry.bytes or []).decode("utf-8", "replace") == entry.token
        )
    assert "".join(e.token for e in content).strip() == resp.choices[0].message.content.strip()  # type: ignore[union-attr]


def test_chat_logprobs_stream_equal_the_non_streamed_ones(daemon: Daemon) -> None:
    args = dict(model=daemon.model, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    whole = client(daemon).chat.completions.create(**args)  # type: ignore[call-overload]
    streamed = []
    for chunk in client(daemon).chat.completions.create(stream=True, **args):  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    expected = whole.choices[0].logprobs.content
    assert [(e.token, e.top_logprobs) for e in streamed] == [(e.token, []) for e in expected]
    assert all(
        math.isclose(a.logprob, b.logprob, abs_tol=1e-5)
        for a, b in zip(streamed, expected, strict=True)
    )


def test_completion_logprobs_legacy_shape(daemon: Daemon) -> None:
    resp = client(daemon).completions.create(
        model=daemon.model, prompt="import os", max_tokens=6, temperature=0, logprobs=2
    )
    lp = resp.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]  # type: ignore[index]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):  # type: ignore[arg-type]
        assert len(top) <= 2 and max(top.values()) == pytest.approx(value, abs=1e-5)
        assert token in top


def test_no_logprobs_unless_asked(daemon: Daemon) -> None:
    resp = client(daemon).chat.completions.create(
        model=daemon.model, messages=MESSAGES, max_tokens=4, temperature=0
    )
    assert resp.choices[0].logprobs is None


def test_top_logprobs_out_of_range_is_a_400(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(daemon).chat.completions.create(
            model=daemon.model, messages=MESSAGES, logprobs=True, top_logprobs=21
        )
    assert info.value.body["param"] == "top_logprobs"  # type: ignore[index]
