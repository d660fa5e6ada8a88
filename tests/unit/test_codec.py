from __future__ import annotations

import msgpack
import pytest

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.messages import (
    PROTOCOL_VERSION,
    Cancel,
    ChatPrompt,
    Embed,
    Embeddings,
    Error,
    Events,
    Finished,
    Generate,
    Ping,
    Pong,
    SamplingParams,
    TextPrompt,
    Thinking,
    TokenDelta,
    TokenLogprob,
    TokenPrompt,
    TopLogprob,
    Usage,
)

USAGE = Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
SAMPLING = SamplingParams(max_tokens=4, temperature=0.5, logit_bias={7: -2.5}, stop=["\n"], seed=3)

MESSAGES = [
    Generate(
        request_id="r1",
        prompt=ChatPrompt(messages=[{"role": "user", "content": "hi"}]),
        sampling=SAMPLING,
        priority="high",
        timeout_s=2.0,
    ),
    Generate(request_id="r2", prompt=TextPrompt(text="héllo 世界"), sampling=SamplingParams()),
    Generate(
        request_id="r5",
        prompt=ChatPrompt(messages=[{"role": "user", "content": "hi"}], thinking=False),
        sampling=SamplingParams(thinking_budget=1024),
    ),
    Generate(request_id="r3", prompt=TokenPrompt(token_ids=[1, 2, 3]), sampling=SAMPLING),
    Cancel(request_id="r1"),
    Embed(request_id="e", inputs=[TextPrompt(text="a"), TokenPrompt(token_ids=[1, 2])]),
    Embeddings(request_id="e", dimensions=1, embeddings=[b"\x00\x00\x80?"], usage=USAGE),
    Ping(request_id="p"),
    Pong(request_id="p", model="m", max_context=4096),
    TokenDelta(request_id="r1", text="é", token_ids=[5, 6]),
    TokenDelta(
        request_id="r1",
        text="<think>",
        token_ids=[5],
        prompt=USAGE,
        thinking=Thinking(start="<think>", end="</think>", inside=True),
    ),
    TokenDelta(
        request_id="r1",
        text="é",
        token_ids=[5],
        logprobs=[
            TokenLogprob(
                token_id=5,
                token=b"\xc3",
                logprob=-0.5,
                top_logprobs=[TopLogprob(token_id=5, token=b"\xc3", logprob=-0.5)],
            )
        ],
    ),
    Generate(
        request_id="r4",
        prompt=TextPrompt(text="x"),
        sampling=SamplingParams(logprobs=True, top_logprobs=3),
    ),
    Finished(request_id="r1", finish_reason="stop", usage=USAGE),
    Finished(request_id="r1", finish_reason="stop", usage=USAGE, stop="END"),
    Error(request_id="r1", code="invalid_request", message="bad", param="top_p"),
    Error(request_id="r1", code="overloaded", message="full", retry_after_s=7.5),
    Events(
        events=[
            TokenDelta(request_id="a", text="x", token_ids=[1]),
            Finished(request_id="a", finish_reason="length", usage=USAGE),
        ]
    ),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    assert codec.decode(codec.encode(msg)) == msg  # type: ignore[arg-type]


def _body(obj: object) -> list[bytes]:
    return [PROTOCOL_VERSION, msgpack.packb(obj)]


@pytest.mark.parametrize(
    "frames, needle",
    [
        ([PROTOCOL_VERSION], "expected 2 frames"),
        ([b"mlxd/0", msgpack.packb({"type": "ping", "request_id": "x"})], "version"),
        ([PROTOCOL_VERSION, b"\xc1\xc1"], "malformed"),
        (_body([1, 2]), "must be a map"),
        (_body({"type": "nope"}), "unknown message type"),
        (_body({"type": "ping"}), "missing field"),
        (_body({"type": "ping", "request_id": 5}), "expected str"),
        (_body({"type": "ping", "request_id": "x", "extra": 1}), "unknown field"),
        (_body({"type": "cancel", "request_id": True}), "expected str"),
        (
            _body({"type": "pong", "request_id": "x", "model": "m", "max_context": True}),
            "expected int",
        ),
        (
            _body(
                {"type": "generate", "request_id": "x", "prompt": {"type": "video"}, "sampling": {}}
            ),
            "expected one of",
        ),
        (
            _body(
                {
                    "type": "generate",
                    "request_id": "x",
                    "prompt": {"type": "tokens", "token_ids": "abc"},
                    "sampling": {},
                }
            ),
            "expected a list",
        ),
        (
            _body({"type": "generate", "request_id": "x", "prompt": None, "sampling": {}}),
            "must not be null",
        ),
        (
            _body(
                {
                    "type": "generate",
                    "request_id": "x",
                    "prompt": {"type": "text", "text": "a"},
                    "sampling": {"logit_bias": [1]},
                }
            ),
            "expected a map",
        ),
        (
            _body({"type": "events", "events": [{"type": "ping", "request_id": "x"}]}),
            "expected one of",
        ),
    ],
)
def test_rejects_malformed_frames(frames: list[bytes], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        codec.decode(frames)


def test_float_fields_accept_ints() -> None:
    frames = _body(
        {
            "type": "generate",
            "request_id": "x",
            "prompt": {"type": "text", "text": "a"},
            "sampling": {"temperature": 1},
        }
    )
    msg = codec.decode(frames)
    assert isinstance(msg, Generate) and msg.sampling.temperature == 1.0
