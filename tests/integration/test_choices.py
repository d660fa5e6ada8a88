"""n > 1: one Generate per choice, seeds seed + i, choices indexed, usage counted once."""

from __future__ import annotations

import httpx
import openai
from scripted_worker import DEFAULT_REPLY, MODEL, ScriptedWorker

SEEDED = [{"role": "user", "content": "SEEDED"}]
SLOW = [{"role": "user", "content": "SLOW please"}]


def test_n_choices_with_consecutive_seeds(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=SEEDED,
        n=3,
        seed=40,
        extra_headers={"X-Request-Id": "n3"},  # type: ignore[arg-type]
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == ["seed 40 .", "seed 41 .", "seed 42 ."]
    ids = sorted(
        g.request_id.rsplit("-", 1)[1] for g in worker.generates if g.request_id.startswith("n3.")
    )
    assert ids == ["0", "1", "2"]


def test_usage_counts_the_prompt_once(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(model=MODEL, messages=SLOW, max_tokens=4)  # type: ignore[arg-type]
    three = client.chat.completions.create(model=MODEL, messages=SLOW, max_tokens=4, n=3)  # type: ignore[arg-type]
    assert one.usage is not None and three.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens == 12
    assert three.usage.total_tokens == three.usage.prompt_tokens + 12
    assert [c.finish_reason for c in three.choices] == ["length"] * 3


def test_unseeded_choices_leave_the_seed_to_the_worker(
    client: openai.OpenAI, worker: ScriptedWorker
) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=SEEDED,
        n=2,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "noseed"},
    )
    seeds = [g.sampling.seed for g in worker.generates if g.request_id.startswith("noseed.")]
    assert seeds == [None, None]


def test_streamed_choices_each_get_role_text_and_finish(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=SEEDED,
            n=3,
            seed=7,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
    )
    texts, roles, finishes = ["", "", ""], [0, 0, 0], [None, None, None]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        roles[choice.index] += choice.delta.role == "assistant"
        finishes[choice.index] = finishes[choice.index] or choice.finish_reason
    assert texts == ["seed 7 .", "seed 8 .", "seed 9 ."]
    assert roles == [1, 1, 1] and finishes == ["stop"] * 3
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 9


def test_completions_n(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="hi", n=2, max_tokens=30)
    assert [(c.index, c.text) for c in reply.choices] == [(0, DEFAULT_REPLY), (1, DEFAULT_REPLY)]
    parts = client.completions.create(model=MODEL, prompt="hi", n=2, max_tokens=30, stream=True)
    texts = ["", ""]
    for chunk in parts:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [DEFAULT_REPLY, DEFAULT_REPLY]


def test_disconnect_cancels_every_choice(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "messages": SLOW, "stream": True, "n": 3}
    headers = {"X-Request-Id": "gone-n"}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert any('"content":"w0 "' in line for line in response.iter_lines())
    cancelled = worker.wait_cancels("gone-n.", 3)
    assert sorted(c.rsplit("-", 1)[1] for c in cancelled) == ["0", "1", "2"]


def test_one_failing_choice_fails_the_request(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {
        "model": MODEL,
        "n": 2,
        "messages": [{"role": "user", "content": "MIDERROR:overloaded"}],
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "overloaded"
