"""The smaller OpenAI fields: max_completion_tokens, stop, user, include_usage, cached tokens."""

from __future__ import annotations

import openai
from scripted_worker import MODEL, ScriptedWorker

HELLO = [{"role": "user", "content": "Say hello"}]


def test_max_completion_tokens_wins_over_max_tokens(
    client: openai.OpenAI, worker: ScriptedWorker
) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=9,  # type: ignore[arg-type]
        max_completion_tokens=2,
        extra_headers={"X-Request-Id": "mct"},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 2
    generate = worker.wait_generate("mct.")
    assert generate is not None and generate.sampling.max_tokens == 2


def test_stop_list_and_user_reach_the_worker(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        stop=["a", "bc"],
        user="u-1",  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "stopu"},
    )
    generate = worker.wait_generate("stopu.")
    assert generate is not None and generate.sampling.stop == ["a", "bc"]


def test_cached_tokens_pass_through(client: openai.OpenAI) -> None:
    cached = [{"role": "user", "content": "CACHED:3 hello"}]
    reply = client.chat.completions.create(model=MODEL, messages=cached)  # type: ignore[arg-type]
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=cached,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            n=2,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 3


def test_best_of_equal_to_n_is_accepted(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="hi", n=2, best_of=2, max_tokens=2)
    assert len(reply.choices) == 2


def test_message_names_reach_the_template(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    named = [{"role": "user", "content": "hi", "name": "ann"}]
    client.chat.completions.create(
        model=MODEL,
        messages=named,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "named"},
    )
    generate = worker.wait_generate("named.")
    assert generate is not None
    assert generate.prompt.messages == named  # type: ignore[union-attr]


def test_reasoning_content_reaches_the_template(
    client: openai.OpenAI, worker: ScriptedWorker
) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "again"},
    ]
    client.chat.completions.create(
        model=MODEL,
        messages=history,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "reasoned"},
    )
    generate = worker.wait_generate("reasoned.")
    assert generate is not None
    assert generate.prompt.messages == history  # type: ignore[union-attr]
