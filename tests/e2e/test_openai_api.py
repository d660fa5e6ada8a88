"""The OpenAI API end to end: `mlxd start` subprocess, real HTTP, the official client."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MESSAGES = [{"role": "user", "content": "Tell me about the python standard library"}]


@cache
def _reference(model_path: Path) -> Any:
    import mlx_lm

    return mlx_lm.load(str(model_path))


def reference_chat(model_path: Path, messages: list[dict[str, str]], max_tokens: int) -> str:
    import mlx_lm

    model, tok = _reference(model_path)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    return str(mlx_lm.generate(model, tok, ids, max_tokens=max_tokens))


_CLIENTS: dict[str, openai.OpenAI] = {}


def client(daemon: Daemon) -> openai.OpenAI:
    if daemon.base_url not in _CLIENTS:
        _CLIENTS[daemon.base_url] = openai.OpenAI(
            base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0
        )
    return _CLIENTS[daemon.base_url]


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for c in _CLIENTS.values():
        c.close()
    _CLIENTS.clear()


def test_chat_completion_matches_mlx_lm_generate(daemon: Daemon) -> None:
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == reference_chat(daemon.model_path, MESSAGES, 24)
    assert resp.usage is not None and resp.usage.completion_tokens <= 24
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_streaming_chat_sends_chunks_then_usage(daemon: Daemon) -> None:
    stream = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 3
    assert text == reference_chat(daemon.model_path, MESSAGES, 16)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]


def test_completion_and_streaming_completion(daemon: Daemon) -> None:
    c = client(daemon)
    full = c.completions.create(
        model=daemon.model, prompt="The quick brown", max_tokens=8, temperature=0
    )
    parts = c.completions.create(
        model=daemon.model, prompt="The quick brown", max_tokens=8, temperature=0, stream=True
    )
    assert full.choices[0].text == "".join(p.choices[0].text for p in parts)
    assert full.usage is not None and full.usage.completion_tokens == 8


def test_models_list_names_the_served_model(daemon: Daemon) -> None:
    assert [m.id for m in client(daemon).models.list()] == [daemon.model]


def test_max_tokens_beyond_context_is_a_400_naming_it(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(daemon).chat.completions.create(
            model=daemon.model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=100_000,
        )
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_unknown_model_is_a_404(daemon: Daemon) -> None:
    r = httpx.post(
        f"{daemon.base_url}/v1/chat/completions", json={"model": "nope", "messages": MESSAGES}
    )
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_garbage_frames_do_not_kill_the_worker(daemon: Daemon) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.worker_endpoint())
    for frames in ([b"garbage"], [b"mlxd/3", b"\xc1\xff"], [b"mlxd/9", b"{}"], [b"a", b"b", b"c"]):
        sock.send_multipart(frames)
        assert sock.poll(5000), "the worker should answer a bad frame with an error"
        reply = sock.recv_multipart()
        assert b"protocol_error" in reply[-1]
    sock.close()
    ctx.term()
    test_models_list_names_the_served_model(daemon)
    resp = client(daemon).completions.create(model=daemon.model, prompt="hi", max_tokens=2)
    assert resp.choices[0].finish_reason in ("length", "stop")
