"""The Responses and Ollama surfaces through cloud backends (docs/BACKENDS.md): a front mlxd
whose remote models sit on an `openai` and an `anthropic` backend, both a second real mlxd (the
session's daemon), with the official openai and ollama clients. Every pairing takes the event
path: the backend kind's request, its answer read as internal events, the surface rendering
them. Greedy text equals the upstream's own answer (in the backend kind's API) for the same
conversation; usage is the upstream's, in the answer and in the request log; stored responses
live in the front's store; a dead upstream fails over to a live one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.e2e.conftest import Daemon, free_port, logged_lines, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.model]

QUESTION = "Tell me about the python standard library"
INSTRUCTIONS = "You are terse."
N = 8  # greedy tokens asked for
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": PARAMETERS,
    "strict": False,
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}
# model -> (its backend, the backend's kind); dead* fail over to the live model of their kind
REMOTE = {"gpt": ("up", "openai"), "claude": ("ant", "anthropic")}
DEAD = {"deadgpt": "gpt", "deadclaude": "claude"}
KINDS = pytest.mark.parametrize("model", list(REMOTE))


@dataclass
class Front:
    daemon: Daemon
    upstream: Daemon
    request_log: Path
    _ollama: ollama.Client | None = None

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.daemon.base_url}/v1", api_key="x", max_retries=0)

    def ollama(self) -> ollama.Client:
        if self._ollama is None:
            self._ollama = ollama.Client(host=self.daemon.base_url, timeout=60)
        return self._ollama

    def close(self) -> None:
        if self._ollama is not None:
            self._ollama._client.close()

    def logged(self, request_id: str) -> dict[str, Any]:
        """The request log's line for ``request_id`` (written once the response is done)."""
        deadline = time.monotonic() + 10
        while True:
            lines = logged_lines(self.request_log)
            found = [x for x in lines if x["request_id"] == request_id]
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"{request_id} not in the request log"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def front(
    tiny_model: Path, shared_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    upstream = f"{shared_daemon.base_url}/v1"
    request_log = tmp_path_factory.mktemp("cross") / "requests.log"
    d = start_daemon(
        tiny_model,
        "--max-context",
        "512",
        "--request-log",
        str(request_log),
        "--backend",
        f"up=openai:{upstream}",
        "--model",
        "gpt=up:tiny",
        "--backend",
        f"ant=anthropic:{upstream}",
        "--model",
        "claude=ant:tiny",
        "--backend",
        f"dead=openai:http://127.0.0.1:{free_port()}/v1",
        "--model",
        "deadgpt=dead:tiny",
        "--fallback",
        "deadgpt=gpt",
        "--backend",
        f"deadant=anthropic:http://127.0.0.1:{free_port()}/v1",
        "--model",
        "deadclaude=deadant:tiny",
        "--fallback",
        "deadclaude=claude",
    )
    made = Front(d, shared_daemon, request_log)
    yield made
    made.close()
    if d.proc.poll() is None:
        stop_daemon(d)


@dataclass
class Direct:
    """The upstream's own answer: its text, tool calls ``(id, name, arguments)`` and usage."""

    text: str
    calls: list[tuple[str, str, dict[str, Any]]]
    prompt_tokens: int
    completion_tokens: int


def direct(front: Front, model: str, messages: list[dict[str, Any]], **kw: Any) -> Direct:
    """Ask the upstream itself, in the API of ``model``'s backend kind, for ``messages``
    (OpenAI-shaped; a leading system message is the Messages API's ``system``)."""
    if REMOTE[model][1] == "openai":
        return _direct_chat(front.upstream, messages, **kw)
    return _direct_message(front.upstream, messages, **kw)


def _direct_chat(upstream: Daemon, messages: list[dict[str, Any]], **kw: Any) -> Direct:
    with openai.OpenAI(base_url=f"{upstream.base_url}/v1", api_key="x") as c:
        answer = c.chat.completions.create(
            model="tiny", messages=messages, max_tokens=N, temperature=0, **kw
        )
    message, usage = answer.choices[0].message, answer.usage
    assert usage is not None
    calls = [
        (t.id, t.function.name, json.loads(t.function.arguments))  # type: ignore[union-attr]
        for t in message.tool_calls or ()
    ]
    return Direct(message.content or "", calls, usage.prompt_tokens, usage.completion_tokens)


def _direct_message(upstream: Daemon, messages: list[dict[str, Any]], **kw: Any) -> Direct:
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [_anthropic_turn(m) for m in messages if m["role"] != "system"]
    extra = {"system": system[0]} if system else {}
    if "tools" in kw:
        tools = [t["function"] for t in kw["tools"]]
        kw["tools"] = [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in tools
        ]
    with anthropic.Anthropic(base_url=upstream.base_url, api_key="x") as c:
        answer = c.messages.create(
            model="tiny", max_tokens=N, messages=turns, extra_body={"temperature": 0}, **extra, **kw
        )
    text = "".join(b.text for b in answer.content if b.type == "text")
    calls = [(b.id, b.name, b.input) for b in answer.content if b.type == "tool_use"]
    usage = answer.usage  # Anthropic's input_tokens leave out the ones read from the cache
    prompt_tokens = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    return Direct(text, calls, prompt_tokens, usage.output_tokens)  # type: ignore[arg-type]


def _anthropic_turn(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        result = {"type": "tool_result", "tool_use_id": message["tool_call_id"]}
        return {"role": "user", "content": [{**result, "content": message["content"]}]}
    calls = message.get("tool_calls") or []
    blocks = [
        {
            "type": "tool_use",
            "id": c["id"],
            "name": c["function"]["name"],
            "input": json.loads(c["function"]["arguments"]),
        }
        for c in calls
    ]
    text = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    return {"role": message["role"], "content": text + blocks}


# The Responses API


@KINDS
def test_responses_create_is_the_upstreams_answer_with_its_usage(front: Front, model: str) -> None:
    with front.openai() as c:
        raw = c.responses.with_raw_response.create(
            model=model,
            instructions=INSTRUCTIONS,
            input=QUESTION,
            max_output_tokens=N,
            temperature=0,
        )
    answer = raw.parse()
    want = direct(
        front,
        model,
        [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}],
    )
    assert raw.headers["x-mlxd-backend"] == REMOTE[model][0] and answer.model == model
    assert answer.output_text == want.text and answer.status == "incomplete"
    assert answer.usage is not None
    assert answer.usage.input_tokens == want.prompt_tokens > 0
    assert answer.usage.output_tokens == want.completion_tokens == N
    logged = front.logged(raw.headers["x-request-id"])
    assert (logged["model"], logged["backend"]) == (model, REMOTE[model][0])
    assert (logged["prompt_tokens"], logged["completion_tokens"]) == (want.prompt_tokens, N)


@KINDS
def test_responses_stream_is_the_upstreams_answer(front: Front, model: str) -> None:
    with (
        front.openai() as c,
        c.responses.stream(model=model, input=QUESTION, max_output_tokens=N, temperature=0) as s,
    ):
        events = list(s)
    final = events[-1].response  # type: ignore[union-attr]
    want = direct(front, model, [{"role": "user", "content": QUESTION}])
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"  # cut by max_output_tokens, as upstream
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == want.text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage is not None and final.usage.input_tokens == want.prompt_tokens


@KINDS
def test_responses_function_tool_round_trip_keeps_the_upstreams_call_id(
    front: Front, model: str
) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    with front.openai() as c:
        first = c.responses.create(
            model=model,
            input=[question],  # type: ignore[list-item]
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=40,
            temperature=0,
        )
        calls = [item for item in first.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather"
        call = calls[0]
        # the upstream's own id: an Anthropic upstream's calls are toolu_ ones
        prefix = "toolu_" if REMOTE[model][1] == "anthropic" else "call_"
        assert call.call_id.startswith(prefix) and call.id != call.call_id
        assert set(json.loads(call.arguments)) == {"city"}
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
        second = c.responses.create(
            model=model,
            previous_response_id=first.id,  # the front's store has the call
            input=[output],  # type: ignore[list-item]
            tools=[WEATHER],
            max_output_tokens=N,
            temperature=0,
        )
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ],
    }
    tool = {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny"}
    want = direct(front, model, [question, assistant, tool], tools=[CHAT_WEATHER])
    assert second.output_text == want.text and want.calls == []
    assert second.usage is not None and second.usage.input_tokens == want.prompt_tokens


@KINDS
def test_previous_response_id_of_a_remote_answer_comes_from_the_fronts_store(
    front: Front, model: str
) -> None:
    with front.openai() as c:
        first = c.responses.create(model=model, input=QUESTION, max_output_tokens=N, temperature=0)
        more = c.responses.create(
            model=model,
            input="And the os module?",
            previous_response_id=first.id,
            max_output_tokens=N,
            temperature=0,
        )
        assert c.responses.retrieve(first.id).output_text == first.output_text
        items = c.responses.input_items.list(first.id)
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the os module?"},
    ]
    want = direct(front, model, conversation)
    assert more.output_text == want.text
    assert more.usage is not None and more.usage.input_tokens == want.prompt_tokens
    assert [i.content[0].text for i in items.data] == [QUESTION]  # type: ignore[union-attr]
    # the upstream never saw a Responses request: it has no such response
    with httpx.Client(base_url=f"{front.upstream.base_url}/v1") as upstream:
        assert upstream.get(f"/responses/{first.id}").status_code == 404


# The Ollama API


@KINDS
@pytest.mark.parametrize("stream", [False, True])
def test_ollama_chat_is_the_upstreams_answer(front: Front, model: str, stream: bool) -> None:
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    options = {"temperature": 0, "num_predict": N}
    # only temperature sent: Ollama's top_k/top_p defaults are the surface's, never sent upstream
    if stream:
        parts = list(
            front.ollama().chat(model=model, messages=messages, options=options, stream=True)
        )
        text, last = "".join(p.message.content or "" for p in parts), parts[-1]
    else:
        last = front.ollama().chat(model=model, messages=messages, options=options)
        text = last.message.content or ""
    want = direct(front, model, messages)
    assert text == want.text and last.done and last.done_reason == "length"
    assert last.model == f"{model}:latest"
    assert (last.prompt_eval_count, last.eval_count) == (want.prompt_tokens, N)
    assert last.total_duration and last.eval_duration and last.prompt_eval_duration
    assert last.total_duration >= last.prompt_eval_duration + last.eval_duration


@KINDS
@pytest.mark.parametrize("stream", [False, True])
def test_ollama_generate_is_the_upstreams_answer(front: Front, model: str, stream: bool) -> None:
    options = {"temperature": 0, "num_predict": N}
    if stream:
        parts = list(
            front.ollama().generate(
                model=f"{model}:latest", prompt=QUESTION, options=options, stream=True
            )
        )
        text, last = "".join(p.response for p in parts), parts[-1]
    else:
        last = front.ollama().generate(model=model, prompt=QUESTION, options=options)
        text = last.response
    want = direct(front, model, [{"role": "user", "content": QUESTION}])
    assert text == want.text and last.done
    assert (last.prompt_eval_count, last.eval_count) == (want.prompt_tokens, N)


@KINDS
def test_ollama_usage_is_in_the_request_log(front: Front, model: str) -> None:
    body = {"model": model, "prompt": QUESTION, "stream": False, "options": {"num_predict": N}}
    resp = httpx.post(f"{front.daemon.base_url}/api/generate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-mlxd-backend"] == REMOTE[model][0]
    answer, logged = resp.json(), front.logged(resp.headers["x-request-id"])
    assert logged["endpoint"] == "/api/generate" and logged["model"] == model
    assert logged["prompt_tokens"] == answer["prompt_eval_count"] > 0
    assert logged["completion_tokens"] == answer["eval_count"] > 0


def test_ollama_defaults_are_not_sent_but_a_sent_option_the_backend_lacks_is_a_400(
    front: Front,
) -> None:
    c = front.ollama()
    # Ollama's temperature 0.8, top_k 40, top_p 0.9 apply locally; an openai backend has no
    # top_k, and the client sent none: served
    assert c.generate(model="gpt", prompt="hi", options={"num_predict": 2}).done
    for options, param in (({"top_k": 5}, "top_k"), ({"min_p": 0.1}, "min_p")):
        with pytest.raises(ollama.ResponseError) as info:
            c.generate(model="gpt", prompt="hi", options={"num_predict": 2, **options})
        assert info.value.status_code == 400 and param in info.value.error
    # an anthropic backend takes top_k, not seed
    assert c.generate(model="claude", prompt="hi", options={"num_predict": 2, "top_k": 5}).done
    with pytest.raises(ollama.ResponseError) as info:
        c.generate(model="claude", prompt="hi", options={"num_predict": 2, "seed": 1})
    assert info.value.status_code == 400 and "seed" in info.value.error


def test_what_the_ollama_api_cannot_send_upstream_is_a_clear_400(front: Front) -> None:
    url = front.daemon.base_url
    cases = [
        ("embed", {"model": "gpt", "input": "x"}, "local models only"),
        ("embeddings", {"model": "gpt:latest", "prompt": "x"}, "local models only"),
        ("generate", {"model": "claude", "prompt": "x", "raw": True}, "text prompt"),
        ("generate", {"model": "gpt"}, "remote model"),  # Ollama's load: nothing to load
    ]
    for route, body, message in cases:
        resp = httpx.post(f"{url}/api/{route}", json=body, timeout=30)
        assert resp.status_code == 400, (route, resp.text)
        assert message in resp.json()["error"], resp.text


# Failover: a dead upstream, then the live one of its kind


@pytest.mark.parametrize("dead", list(DEAD))
def test_responses_fail_over_from_a_dead_upstream(front: Front, dead: str) -> None:
    live = DEAD[dead]
    with front.openai() as c:
        raw = c.responses.with_raw_response.create(
            model=dead, input=QUESTION, max_output_tokens=N, temperature=0
        )
        with c.responses.stream(
            model=dead, input=QUESTION, max_output_tokens=N, temperature=0
        ) as s:
            streamed = list(s)[-1].response  # type: ignore[union-attr]
    answer, want = raw.parse(), direct(front, live, [{"role": "user", "content": QUESTION}])
    assert raw.headers["x-mlxd-backend"] == REMOTE[live][0] and answer.model == live
    assert answer.output_text == streamed.output_text == want.text


@pytest.mark.parametrize("dead", list(DEAD))
@pytest.mark.parametrize("stream", [False, True])
def test_ollama_fails_over_from_a_dead_upstream(front: Front, dead: str, stream: bool) -> None:
    live = DEAD[dead]
    body = {
        "model": dead,
        "messages": [{"role": "user", "content": QUESTION}],
        "options": {"temperature": 0, "num_predict": N},
        "stream": stream,
    }
    resp = httpx.post(f"{front.daemon.base_url}/api/chat", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-mlxd-backend"] == REMOTE[live][0]
    lines = [json.loads(x) for x in resp.text.splitlines() if x.strip()]
    text = "".join(x["message"]["content"] for x in lines)
    want = direct(front, live, [{"role": "user", "content": QUESTION}])
    assert text == want.text and lines[-1]["done"] and lines[-1]["model"] == f"{live}:latest"
