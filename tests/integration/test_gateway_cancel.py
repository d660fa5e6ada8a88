"""Clients that go away cancel their request on the worker; a noisy worker breaks nothing."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
from scripted_worker import DEFAULT_REPLY, MODEL, ScriptedWorker

from mlxd.protocol import codec
from mlxd.protocol.messages import PROTOCOL_VERSION, Finished, TokenDelta, Usage

SLOW = {"model": MODEL, "messages": [{"role": "user", "content": "SLOW please"}]}


def test_stream_disconnect_cancels(http: httpx.Client, worker: ScriptedWorker) -> None:
    headers = {"X-Request-Id": "gone-stream"}
    body = {**SLOW, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        lines = response.iter_lines()
        assert any('"content":"w0 "' in line for line in lines)
    # Leaving the block closes the connection mid-stream.
    assert worker.wait_cancel("gone-stream.") is not None


def test_non_stream_disconnect_cancels(http: httpx.Client, worker: ScriptedWorker) -> None:
    headers = {"X-Request-Id": "gone-json"}
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json=SLOW, headers=headers, timeout=0.3)
    assert worker.wait_cancel("gone-json.") is not None


def test_finished_request_is_not_cancelled(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "done"})
    assert response.text.endswith("data: [DONE]\n\n")
    assert worker.wait_cancel("done.", timeout_s=0.2) is None


GARBAGE = [
    [b"just one frame"],
    [b"mlxd/999", b"\x80"],
    [PROTOCOL_VERSION, b"\xc1 not msgpack"],
    [PROTOCOL_VERSION, b"\x81\xa4type\xa7unknown"],
    codec.encode(TokenDelta(request_id="nobody", text="x", token_ids=[1])),
    codec.encode(
        Finished(
            request_id="nobody",
            finish_reason="stop",
            usage=Usage(prompt_tokens=1, completion_tokens=1),
        )
    ),
]


def test_garbage_from_worker_is_dropped(
    client: openai.OpenAI, worker: ScriptedWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mlxd.gateway.backends.local.workers")
    messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    for frames in GARBAGE:  # the worker now knows our DEALER's identity
        worker.inject(frames)
    reply = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == DEFAULT_REPLY
    assert sum("dropped a bad frame set" in r.getMessage() for r in caplog.records) >= 4
