"""The Ollama surface's pure parts: options -> sampling, keep_alive, model names, bodies ->
requests, and the NDJSON lines written from a worker's events (tool calls split out)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.request import Opened
from mlxd.gateway.surfaces.ollama.body import ChatShape, GenerateShape
from mlxd.gateway.surfaces.ollama.names import display, resolve
from mlxd.gateway.surfaces.ollama.options import sampling_params
from mlxd.gateway.surfaces.ollama.schemas import (
    ModelOnly,
    OllamaRequest,
    keep_alive_s,
    parse_chat,
    parse_generate,
)
from mlxd.gateway.surfaces.ollama.stream import ndjson_lines
from mlxd.protocol.messages import (
    ChatPrompt,
    Finished,
    JsonFormat,
    TextPrompt,
    Thinking,
    TokenDelta,
    Usage,
)

# Options


def test_defaults_are_ollamas() -> None:
    p = sampling_params(None)
    assert (p.temperature, p.top_k, p.top_p, p.max_tokens) == (0.8, 40, 0.9, None)
    assert p.repetition_penalty == 1.0 and p.stop == [] and p.seed is None


def test_mapped_options() -> None:
    p = sampling_params(
        {
            "num_predict": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "seed": 42,
            "stop": ["\n", "END"],
            "repeat_penalty": 1.2,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "num_ctx": 2048,
        }
    )
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (7, 0.0, 0.5, 3, 0.1)
    assert (p.seed, p.stop, p.repetition_penalty) == (42, ["\n", "END"], 1.2)
    assert (p.presence_penalty, p.frequency_penalty) == (0.5, -0.5)


@pytest.mark.parametrize("value", [-1, -2])
def test_num_predict_negative_is_unbounded(value: int) -> None:
    assert sampling_params({"num_predict": value}).max_tokens is None


def test_runner_and_unknown_options_are_ignored() -> None:
    ignored = {"num_gpu": 1, "mirostat": 2, "use_mmap": True, "num_thread": 8, "whatever": "x"}
    assert sampling_params(ignored) == sampling_params({})


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"num_predict": 0}, "num_predict"),
        ({"num_predict": -3}, "num_predict"),
        ({"seed": "7"}, "seed"),
        ({"stop": [1]}, "stop"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"min_p": True}, "min_p"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        sampling_params(options)
    assert param in info.value.message


def test_options_must_be_an_object() -> None:
    with pytest.raises(InvalidRequest):
        sampling_params([1])


def test_num_ctx_is_checked() -> None:
    with pytest.raises(InvalidRequest, match="num_ctx"):
        parse_chat(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "options": {"num_ctx": "big"},
            }
        )


# keep_alive and names


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (300, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (-1, -1.0),
        ("-1m", -60.0),
        ("250ms", 0.25),
    ],
)
def test_keep_alive(value: Any, seconds: float) -> None:
    assert keep_alive_s(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5x", True, [], "5m junk"])
def test_bad_keep_alive(value: Any) -> None:
    with pytest.raises(InvalidRequest, match="keep_alive"):
        keep_alive_s(value)


def test_names() -> None:
    assert display("tiny") == "tiny:latest"
    assert display("ollama:llama3:8b") == "llama3:8b"
    assert display("ollama:llama3") == "llama3:latest"
    assert display("hf.co/org/model") == "hf.co/org/model:latest"
    known = ["tiny", "ollama:llama3:8b", "qwen:7b"]
    assert resolve("tiny:latest", known) == "tiny" and resolve("tiny", known) == "tiny"
    assert resolve("llama3:8b", known) == "ollama:llama3:8b"
    assert resolve("qwen:7b", known) == "qwen:7b" and resolve("nope", known) == "nope"


# Bodies


def test_chat_with_tool_history() -> None:
    call = {"function": {"name": "f", "arguments": {"a": 1}}}
    parsed = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [call], "thinking": "hm"},
                {"role": "tool", "content": "42", "tool_name": "f"},
            ],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "format": "json",
            "stream": False,
            "keep_alive": 0,
            "think": True,
        }
    )
    assert isinstance(parsed, OllamaRequest) and isinstance(parsed.prompt, ChatPrompt)
    assistant, tool = parsed.prompt.messages[1:]
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert tool == {"role": "tool", "content": "42", "name": "f"}
    assert parsed.parse_tools and parsed.prompt.tools and not parsed.stream
    assert parsed.sampling.response_format == JsonFormat()
    assert parsed.keep_alive_s == 0 and parsed.think is True
    assert parsed.prompt.thinking is True and parsed.reasoning  # the switch, and split
    assert assistant["reasoning_content"] == "hm"  # replayed where the template has a place


@pytest.mark.parametrize(
    ("think", "switch"), [(None, None), (False, False), (True, True), ("low", True)]
)
def test_think_sets_the_template_switch(think: Any, switch: bool | None) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "think": think}
    for parsed in (parse_chat(body), parse_generate({"model": "m", "prompt": "x", "think": think})):
        assert isinstance(parsed, OllamaRequest) and isinstance(parsed.prompt, ChatPrompt)
        assert parsed.prompt.thinking is switch and parsed.reasoning is (think is not None)


def test_chat_streams_by_default_and_a_schema_is_passed_on() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    parsed = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "format": schema}
    )
    assert isinstance(parsed, OllamaRequest) and parsed.stream and not parsed.parse_tools
    assert parsed.sampling.response_format == JsonFormat(schema=json.dumps(schema))


def test_bodies_without_input_load_or_unload() -> None:
    assert parse_chat({"model": "m"}) == ModelOnly("m", None)
    assert parse_chat({"model": "m", "messages": [], "keep_alive": 0}) == ModelOnly("m", 0.0)
    assert parse_generate({"model": "m", "prompt": ""}) == ModelOnly("m", None)


def test_generate_raw_and_templated() -> None:
    raw = parse_generate({"model": "m", "prompt": "hi", "raw": True})
    assert isinstance(raw, OllamaRequest) and raw.prompt == TextPrompt(text="hi")
    chat = parse_generate({"model": "m", "prompt": "hi", "system": "be brief"})
    assert isinstance(chat, OllamaRequest) and isinstance(chat.prompt, ChatPrompt)
    assert [m["role"] for m in chat.prompt.messages] == ["system", "user"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
        {"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": {"x": 1}}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "all"},
        {"model": "", "messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}]},
    ],
)
def test_bad_chat_bodies(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        parse_chat(body)


# NDJSON lines


class _Script:
    """An ``EventStream`` that plays a fixed list of events (one choice)."""

    request_id = "r"
    num_choices = 1

    def __init__(self, events: list[TokenDelta | Finished]) -> None:
        self.events = list(events)
        self.cancelled = False

    def __aiter__(self) -> _Script:
        return self

    async def __anext__(self) -> TokenDelta | Finished:
        return self.events.pop(0)

    def next_ready(self) -> TokenDelta | Finished | None:
        return None  # one line per event, to see each

    @property
    def is_done(self) -> bool:
        return not self.events

    def index(self, event: TokenDelta | Finished) -> int:
        return 0

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=9, completion_tokens=4)

    async def cancel(self) -> None:
        self.cancelled = True


def _lines(texts: list[str], parsed: OllamaRequest, shape: Any) -> list[dict[str, Any]]:
    deltas: list[TokenDelta | Finished] = [
        TokenDelta(request_id="r", text=t, token_ids=[1]) for t in texts
    ]
    script = _Script(
        deltas[1:]
        + [
            Finished(
                request_id="r",
                finish_reason="stop",
                usage=Usage(prompt_tokens=9, completion_tokens=4),
            )
        ]
    )
    now = time.perf_counter()
    record = RequestRecord("r", "POST", "/api/chat", now - 0.5, load_s=0.1, sent_at=now)
    opened = Opened(parsed, script, time.monotonic() + 10, record)  # type: ignore[arg-type]

    async def run() -> list[bytes]:
        return [line async for line in ndjson_lines(opened, deltas[0], shape, "m:latest")]

    out = b"".join(asyncio.run(run()))
    assert out.endswith(b"\n") and script.cancelled
    return [json.loads(line) for line in out.splitlines()]


def test_ndjson_chat_lines_split_tool_calls() -> None:
    parsed = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        }
    )
    assert isinstance(parsed, OllamaRequest)
    texts = ["Sure. <tool", '_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', " done"]
    lines = _lines(texts, parsed, ChatShape())
    assert lines[0]["message"] == {"role": "assistant", "content": "Sure. "}
    assert lines[1]["message"]["tool_calls"] == [{"function": {"name": "f", "arguments": {"a": 1}}}]
    assert "".join(line["message"]["content"] for line in lines) == "Sure.  done"
    last = lines[-1]
    assert last["done"] is True and last["done_reason"] == "stop"
    assert (last["prompt_eval_count"], last["eval_count"]) == (9, 4)
    assert last["load_duration"] == 100_000_000 and last["total_duration"] >= 500_000_000
    assert all(line["done"] is False for line in lines[:-1])


def test_ndjson_thinking_goes_apart() -> None:
    parsed = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "think": True}
    )
    assert isinstance(parsed, OllamaRequest)
    marks = Thinking(start="<think>", end="</think>", inside=True)
    first = TokenDelta(request_id="r", text="hmm ", token_ids=[1], thinking=marks)
    rest = [TokenDelta(request_id="r", text=t, token_ids=[1]) for t in ("ok</th", "ink>\n\nHi")]
    end = Finished(
        request_id="r", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=3)
    )
    script = _Script([*rest, end])
    record = RequestRecord("r", "POST", "/api/chat", time.perf_counter())
    opened = Opened(parsed, script, time.monotonic() + 10, record)  # type: ignore[arg-type]

    async def run() -> list[bytes]:
        return [line async for line in ndjson_lines(opened, first, ChatShape(), "m")]

    lines = [json.loads(x) for x in b"".join(asyncio.run(run())).splitlines()]
    assert "".join(x["message"].get("thinking", "") for x in lines) == "hmm ok"
    assert "".join(x["message"]["content"] for x in lines) == "Hi"


def test_ndjson_generate_lines() -> None:
    parsed = parse_generate({"model": "m", "prompt": "hi"})
    assert isinstance(parsed, OllamaRequest)
    lines = _lines(["a", "b"], parsed, GenerateShape())
    assert [line["response"] for line in lines] == ["a", "b", ""] and lines[-1]["done"]
