"""The Ollama API (/api/*) through the official ollama Python client, on a real daemon that also
listens on a second port (--ollama-port): chat and generate (streamed and not), embed, list,
ps, show, version, tool-call history, format schemas, keep_alive (0, a duration, forever),
and bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import ollama
import openai
import pytest

from tests.e2e.conftest import Daemon, free_port, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.model]

GREEDY = {"temperature": 0, "num_predict": 12}
HELLO = [{"role": "user", "content": "Say hello"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def ollama_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def daemon(tiny_model: Path, ollama_port: int, shared_daemon: Daemon) -> Iterator[Daemon]:
    # A remote model beside the local one: "gpt", the session's daemon behind an openai backend
    # (tests/e2e/test_cross_surfaces.py serves the Ollama API through both backend kinds).
    d = start_daemon(
        tiny_model,
        "--max-context",
        "512",
        "--ollama-port",
        str(ollama_port),
        "--backend",
        f"up=openai:{shared_daemon.base_url}/v1",
        "--model",
        "gpt=up:tiny",
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


_CLIENTS: dict[str, ollama.Client] = {}
_OPENAI: dict[str, openai.OpenAI] = {}


def client(daemon: Daemon | str) -> ollama.Client:
    host = daemon if isinstance(daemon, str) else daemon.base_url
    if host not in _CLIENTS:
        _CLIENTS[host] = ollama.Client(host=host, timeout=60)
    return _CLIENTS[host]


def openai_client(daemon: Daemon) -> openai.OpenAI:
    if daemon.base_url not in _OPENAI:
        _OPENAI[daemon.base_url] = openai.OpenAI(
            base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0
        )
    return _OPENAI[daemon.base_url]


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for c in _CLIENTS.values():
        c._client.close()
    for o in _OPENAI.values():
        o.close()
    _CLIENTS.clear()
    _OPENAI.clear()


def _names(daemon: Daemon, route: str) -> list[str]:
    return [m.model for m in getattr(client(daemon), route)().models]


# Generation


def test_chat_not_streamed_has_measured_durations(daemon: Daemon) -> None:
    resp = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY, stream=False)
    assert resp.done and resp.done_reason in ("stop", "length")
    assert resp.message.role == "assistant" and resp.message.content
    assert resp.model == "tiny:latest"
    assert resp.eval_count and 0 < resp.eval_count <= 12
    assert resp.prompt_eval_count and resp.prompt_eval_count > 3
    assert resp.eval_duration and resp.prompt_eval_duration and resp.total_duration
    assert resp.load_duration is not None
    parts = resp.load_duration + resp.prompt_eval_duration + resp.eval_duration
    assert resp.total_duration >= parts  # each measured in the gateway, within the total
    assert resp.total_duration < 60e9


def test_chat_streamed_equals_not_streamed(daemon: Daemon) -> None:
    whole = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY)
    chunks = list(client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY, stream=True))
    assert len(chunks) >= 2 and all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].eval_count == whole.eval_count and chunks[-1].total_duration


def test_stream_is_ndjson(daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": HELLO, "options": GREEDY}
    with httpx.stream("POST", f"{daemon.base_url}/api/chat", json=body) as resp:
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] >= 1
    assert all(line["done"] is False for line in lines[:-1])


def test_greedy_chat_equals_openai_chat_completions(daemon: Daemon) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour"},
    ]
    ours = client(daemon).chat(model="tiny", messages=messages, options=GREEDY)
    theirs = openai_client(daemon).chat.completions.create(
        model="tiny",
        messages=messages,
        temperature=0,
        max_tokens=12,  # type: ignore[arg-type]
    )
    assert ours.message.content == theirs.choices[0].message.content
    assert ours.eval_count == theirs.usage.completion_tokens  # type: ignore[union-attr]
    assert ours.prompt_eval_count == theirs.usage.prompt_tokens  # type: ignore[union-attr]


def test_generate_uses_the_chat_template_or_raw(daemon: Daemon) -> None:
    gen = client(daemon).generate(model="tiny", prompt="Say hello", options=GREEDY)
    chat = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY)
    assert gen.done and gen.response == chat.message.content
    raw = client(daemon).generate(model="tiny", prompt="Say hello", raw=True, options=GREEDY)
    assert raw.prompt_eval_count and raw.prompt_eval_count < gen.prompt_eval_count  # type: ignore[operator]
    text = openai_client(daemon).completions.create(
        model="tiny", prompt="Say hello", temperature=0, max_tokens=12
    )
    assert raw.response == text.choices[0].text
    streamed = list(
        client(daemon).generate(model="tiny", prompt="Say hello", options=GREEDY, stream=True)
    )
    assert "".join(c.response for c in streamed) == gen.response and streamed[-1].done


def test_options_stop_seed_and_num_predict(daemon: Daemon) -> None:
    opts = {"temperature": 1.0, "seed": 7, "num_predict": 20, "top_k": 0, "top_p": 1.0}
    first = client(daemon).chat(model="tiny", messages=HELLO, options=opts)
    again = client(daemon).chat(model="tiny", messages=HELLO, options=opts)
    assert first.message.content == again.message.content  # seeded
    assert first.eval_count == 20 and first.done_reason == "length"
    stop = first.message.content[5:8]
    cut = client(daemon).chat(model="tiny", messages=HELLO, options={**opts, "stop": [stop]})
    assert stop not in cut.message.content and cut.done_reason == "stop"
    ignored = {**opts, "num_ctx": 4096, "mirostat": 2, "num_gpu": 1, "use_mmap": True}
    assert client(daemon).chat(model="tiny", messages=HELLO, options=ignored).message.content


def test_format_schema_output_parses(daemon: Daemon) -> None:
    resp = client(daemon).chat(
        model="tiny", messages=HELLO, format=SCHEMA, options={"num_predict": 160, "seed": 1}
    )
    assert resp.done_reason == "stop"
    jsonschema.validate(json.loads(resp.message.content or ""), SCHEMA)
    gen = client(daemon).generate(
        model="tiny", prompt="hi", format=SCHEMA, options={"num_predict": 160, "seed": 2}
    )
    jsonschema.validate(json.loads(gen.response), SCHEMA)


def test_tools_reach_the_template_and_tool_history_round_trips(daemon: Daemon) -> None:
    plain = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY)
    with_tools = client(daemon).chat(model="tiny", messages=HELLO, tools=TOOLS, options=GREEDY)
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 20  # type: ignore[operator]
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"},
    ]
    resp = client(daemon).chat(model="tiny", messages=history, tools=TOOLS, options=GREEDY)
    assert resp.done and resp.eval_count
    # The call and its result are in the prompt (Qwen's template renders both).
    shorter = client(daemon).chat(model="tiny", messages=history[:1], tools=TOOLS, options=GREEDY)
    assert resp.prompt_eval_count > shorter.prompt_eval_count + 10  # type: ignore[operator]


THINKING_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_think_returns_thinking_apart(daemon: Daemon) -> None:
    # A raw prompt that opens <think>: the output starts inside thinking (the worker says so).
    opts = {"temperature": 0, "num_predict": 16}
    inline = client(daemon).generate(model="tiny", prompt=THINKING_PROMPT, raw=True, options=opts)
    split = client(daemon).generate(
        model="tiny", prompt=THINKING_PROMPT, raw=True, think=True, options=opts
    )
    assert split.thinking and split.thinking.strip() in inline.response
    assert "<think>" not in (split.thinking + split.response)
    streamed = list(
        client(daemon).generate(
            model="tiny", prompt=THINKING_PROMPT, raw=True, think=True, options=opts, stream=True
        )
    )
    assert "".join(c.thinking or "" for c in streamed) == split.thinking
    assert "".join(c.response for c in streamed) == split.response


# Embeddings


def test_embed_equals_openai_embeddings(daemon: Daemon) -> None:
    texts = ["hello world", "import os"]
    resp = client(daemon).embed(model="tiny", input=texts)
    ours = np.array(resp.embeddings)
    assert ours.shape == (2, 64) and np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    theirs = openai_client(daemon).embeddings.create(model="tiny", input=texts)
    assert np.allclose(ours, [d.embedding for d in theirs.data], atol=1e-6)
    assert resp.prompt_eval_count == theirs.usage.prompt_tokens and resp.total_duration
    one = client(daemon).embed(model="tiny:latest", input="hello world")
    assert np.allclose(one.embeddings[0], ours[0], atol=1e-6)
    old = client(daemon).embeddings(model="tiny", prompt="hello world")
    assert np.allclose(old.embedding, ours[0], atol=1e-6)


# Models


def test_list_names_are_what_chat_accepts(daemon: Daemon) -> None:
    names = _names(daemon, "list")
    assert names == ["tiny:latest", "gpt:latest"]
    for name in (*names, "tiny", "gpt"):
        assert client(daemon).chat(model=name, messages=HELLO, options=GREEDY).done


def test_ps_show_and_version(daemon: Daemon) -> None:
    client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY)
    loaded = client(daemon).ps().models
    assert [m.model for m in loaded] == ["tiny:latest"]
    assert loaded[0].context_length == 512 and loaded[0].size and loaded[0].expires_at
    shown = client(daemon).show("tiny:latest")
    assert shown.details and shown.details.family == "qwen3"
    assert shown.modelinfo and shown.modelinfo["qwen3.context_length"] == 512
    assert shown.capabilities and "completion" in shown.capabilities
    version = httpx.get(f"{daemon.base_url}/api/version").json()
    assert version["version"] and version["mlxd"]


def test_keep_alive_zero_unloads_and_a_bare_request_loads(daemon: Daemon) -> None:
    client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY, keep_alive=0)
    _wait_until(lambda: _names(daemon, "ps") == [])
    status = daemon.admin_get("/admin/status").json()
    assert "keep_alive" in json.dumps(status)  # the unload's reason
    loaded = client(daemon).generate(model="tiny")  # Ollama's load: a body with only a model
    assert loaded.done_reason == "load" and _names(daemon, "ps") == ["tiny:latest"]
    gone = client(daemon).chat(model="tiny:latest", messages=[], keep_alive=0)
    assert gone.done_reason == "unload" and _names(daemon, "ps") == []
    streamed = list(
        client(daemon).chat(
            model="tiny", messages=HELLO, options=GREEDY, stream=True, keep_alive="0s"
        )
    )
    assert streamed[-1].done
    _wait_until(lambda: _names(daemon, "ps") == [])
    reloaded = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY, keep_alive="5m")
    assert _names(daemon, "ps") == ["tiny:latest"]
    assert reloaded.load_duration and reloaded.load_duration > 50e6  # the worker's start
    assert reloaded.total_duration and reloaded.total_duration > reloaded.load_duration


def test_keep_alive_duration_unloads_after_that_long_idle(daemon: Daemon) -> None:
    # The daemon's own keep-alive is forever (the default): the request's 2 s wins.
    client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY, keep_alive="2s")
    answered = time.monotonic()
    loaded = client(daemon).ps().models
    assert [m.model for m in loaded] == ["tiny:latest"]
    expires = loaded[0].expires_at
    assert expires is not None and expires.timestamp() < time.time() + 10  # not "forever"
    _wait_until(lambda: _names(daemon, "ps") == [])  # polling ps does not keep it loaded
    assert time.monotonic() - answered > 1.5
    reason = "its last request's keep_alive: 2 s"  # the unload's, once it is done
    _wait_until(lambda: reason in json.dumps(daemon.admin_get("/admin/status").json()))


def test_keep_alive_forever_outlasts_a_short_server_keep_alive(tiny_model: Path) -> None:
    d = start_daemon(tiny_model, "--keep-alive", "1")
    try:
        client(d).generate(model="tiny", prompt="Hi", options=GREEDY, keep_alive=-1)
        time.sleep(3)
        assert _names(d, "ps") == ["tiny:latest"]
        # A request without keep_alive puts the server's back: 1 s idle, then it unloads.
        client(d).generate(model="tiny", prompt="Hi", options=GREEDY)
        _wait_until(lambda: _names(d, "ps") == [])
    finally:
        stop_daemon(d)


def test_the_ollama_port_serves_the_same_api(daemon: Daemon, ollama_port: int) -> None:
    other = client(f"http://127.0.0.1:{ollama_port}")
    assert [m.model for m in other.list().models] == ["tiny:latest", "gpt:latest"]
    ours = other.chat(model="tiny", messages=HELLO, options=GREEDY)
    assert (
        ours.message.content
        == client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY).message.content
    )


# Bad input


@pytest.mark.parametrize(
    ("route", "body", "status", "words"),
    [
        ("chat", b"{not json", 400, "not valid JSON"),
        ("chat", b"[1, 2]", 400, "JSON object"),
        ("chat", {"model": "tiny", "messages": "hi"}, 400, "messages"),
        ("chat", {"model": 5, "messages": HELLO}, 400, "model"),
        ("chat", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        (
            "chat",
            {"model": "tiny", "messages": HELLO, "options": {"temperature": "hot"}},
            400,
            "temperature",
        ),
        ("chat", {"model": "tiny", "messages": HELLO, "stream": "yes"}, 400, "stream"),
        ("chat", {"model": "tiny", "messages": HELLO, "format": "xml"}, 400, "format"),
        ("chat", {"model": "tiny", "messages": HELLO, "keep_alive": "soon"}, 400, "keep_alive"),
        ("chat", {"model": "tiny", "messages": HELLO, "think": "very"}, 400, "think"),
        (
            "chat",
            {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            400,
            "images",
        ),
        ("chat", {"model": "nope", "messages": HELLO}, 404, "nope"),
        ("generate", {"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "suffix"),
        ("generate", {"model": "tiny", "prompt": "x", "images": ["aGk="]}, 400, "images"),
        ("generate", {"model": "nope", "prompt": "x"}, 404, "nope"),
        ("embed", {"model": "tiny", "input": [1, 2]}, 400, "input"),
        ("embed", {"model": "nope", "input": "x"}, 404, "nope"),
        ("embeddings", {"model": "tiny"}, 400, "prompt"),
        ("show", {"model": "nope"}, 404, "nope"),
        ("pull", {"model": "llama3"}, 501, "ollama:NAME"),
        ("create", {"model": "x"}, 501, "Modelfile"),
        ("copy", {"source": "tiny", "destination": "x"}, 501, "aliases"),
        ("delete", {"model": "tiny"}, 501, "unload"),
        ("push", {"model": "tiny"}, 501, "publish"),
    ],
)
def test_bad_input_is_an_ollama_error(
    daemon: Daemon, route: str, body: Any, status: int, words: str
) -> None:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    resp = httpx.post(f"{daemon.base_url}/api/{route}", timeout=30, **kwargs)  # type: ignore[arg-type]
    assert resp.status_code == status, resp.text
    assert list(resp.json()) == ["error"] and words in resp.json()["error"]


def test_oversized_body_is_413_and_the_daemon_keeps_serving(daemon: Daemon) -> None:
    huge = {"model": "tiny", "messages": [{"role": "user", "content": "x" * (9 * 2**20)}]}
    resp = httpx.post(f"{daemon.base_url}/api/chat", json=huge, timeout=30)
    assert resp.status_code == 413 and "error" in resp.json()
    with pytest.raises(ollama.ResponseError) as info:
        client(daemon).chat(model="missing:7b", messages=HELLO)
    assert info.value.status_code == 404
    assert client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY).done


def test_a_remote_model_answers_as_its_upstream(daemon: Daemon) -> None:
    # the upstream serves the same weights: the same greedy answer as the local model
    local = client(daemon).chat(model="tiny", messages=HELLO, options=GREEDY)
    remote = client(daemon).chat(model="gpt:latest", messages=HELLO, options=GREEDY)
    assert remote.model == "gpt:latest" and remote.eval_count == local.eval_count
    assert remote.message.content == local.message.content


def _wait_until(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
