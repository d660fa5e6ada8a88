"""Thinking returned on the OpenAI surfaces end to end: a made model whose chat template opens
``<think>`` in its generation prompt (Qwen3's switch), served by a real daemon, asked through
the official openai client. The model is random, so its output starts inside thinking and rarely
leaves it: the tests check where the thinking goes and that its tokens are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.test_anthropic_thinking_e2e import with_thinking_template

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture(scope="module")
def thinker(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    model = with_thinking_template(tiny_model, tmp_path_factory.mktemp("m") / "tiny-thinker")
    d = start_daemon(model, name="thinker")
    yield d
    stop_daemon(d)


@pytest.fixture
def oai(thinker: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{thinker.base_url}/v1", api_key="x", max_retries=0) as client:
        yield client


def test_responses_reasoning_item(oai: openai.OpenAI, thinker: Daemon) -> None:
    response = oai.responses.create(
        model=thinker.model,
        input="Tell me about pathlib",
        reasoning={"effort": "high"},
        max_output_tokens=12,
        temperature=0,
    )
    first = response.output[0]
    assert first.type == "reasoning" and first.content
    assert first.content[0].type == "reasoning_text" and first.content[0].text
    assert response.usage is not None
    assert 0 < response.usage.output_tokens_details.reasoning_tokens
    assert response.usage.output_tokens_details.reasoning_tokens <= response.usage.output_tokens


def test_responses_thinking_off_has_no_reasoning(oai: openai.OpenAI, thinker: Daemon) -> None:
    response = oai.responses.create(
        model=thinker.model,
        input="Tell me about pathlib",
        reasoning={"effort": "none"},
        max_output_tokens=12,
        temperature=0,
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_chat_reasoning_content_streamed(oai: openai.OpenAI, thinker: Daemon) -> None:
    chunks = list(
        oai.chat.completions.create(
            model=thinker.model,
            messages=[{"role": "user", "content": "Tell me about pathlib"}],
            reasoning_effort="medium",
            max_completion_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert thought
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) <= usage.completion_tokens
