"""The gateway's happy paths, through the official openai client, real uvicorn and real ZMQ."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
from scripted_worker import DEFAULT_REPLY, MODEL, ScriptedWorker

from mlxd.protocol.messages import ChatPrompt, TextPrompt, TokenPrompt

HELLO = [{"role": "user", "content": "Say hello"}]


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO)  # type: ignore[arg-type]
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == DEFAULT_REPLY
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(DEFAULT_REPLY.split())
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_stream(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, stream=True))  # type: ignore[arg-type]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == DEFAULT_REPLY
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.usage is None for c in chunks)


def test_chat_stream_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == len(DEFAULT_REPLY.split())
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_max_tokens_truncates_with_length(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "Hello from the "
    assert reply.choices[0].finish_reason == "length"


def test_completion(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon a time")
    assert reply.id.startswith("cmpl-")
    assert reply.object == "text_completion"
    assert reply.choices[0].text == DEFAULT_REPLY
    generate = worker.generates[-1]
    assert generate.prompt == TextPrompt(text="Once upon a time")
    assert generate.sampling.max_tokens == 16  # OpenAI's default for /v1/completions


def test_completion_stream(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Once", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == DEFAULT_REPLY
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.object == "text_completion" for c in chunks)


def test_completion_token_prompt(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    client.completions.create(model=MODEL, prompt=[1, 2, 3], extra_headers={"X-Request-Id": "tok"})
    generate = worker.wait_generate("tok.")
    assert generate is not None
    assert generate.prompt == TokenPrompt(token_ids=[1, 2, 3])


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_health(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200
    model = {"model": MODEL, "ready": True, "state": "ready", "reason": None}
    assert response.json() == {"status": "ok", "models": [model], "backends": [], "failed": []}


def test_readiness_of_one_model(http: httpx.Client) -> None:
    ready = http.get("/health/ready", params={"model": MODEL})
    assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
    assert http.get("/health/ready").status_code == 200
    unknown = http.get("/health/ready", params={"model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_request_id_round_trips(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "messages": HELLO}
    response = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "rid-42"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "rid-42"
    assert worker.wait_generate("rid-42.") is not None


def test_request_id_is_made_when_missing(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO})
    assert len(response.headers["x-request-id"]) >= 16


def test_same_client_request_id_twice_at_once(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "messages": HELLO, "stream": True}
    headers = {"X-Request-Id": "dup"}
    with httpx.Client(base_url=str(http.base_url)) as other:
        with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as first:
            with other.stream("POST", "/v1/chat/completions", json=body, headers=headers) as second:
                texts = [r.read().decode() for r in (first, second)]
    assert all(t.endswith("data: [DONE]\n\n") for t in texts)
    ids = {g.request_id for g in worker.generates if g.request_id.startswith("dup.")}
    assert len(ids) == 2


def test_sampling_fields_reach_the_worker(client: openai.OpenAI, worker: ScriptedWorker) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        temperature=0.5,
        top_p=0.9,
        stop="END",
        seed=7,  # type: ignore[arg-type]
        presence_penalty=0.5,
        logit_bias={"42": -100},
        extra_headers={"X-Request-Id": "sp"},
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "priority": "high"},
    )
    generate = worker.wait_generate("sp.")
    assert generate is not None
    s = generate.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.5, 0.9, 5, 0.1)
    assert (s.stop, s.seed, s.presence_penalty, s.repetition_penalty) == (["END"], 7, 0.5, 1.1)
    assert s.logit_bias == {42: -100.0}
    assert generate.priority == "high"
    assert generate.timeout_s == 900.0


def test_priority_header(http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "messages": HELLO}
    headers = {"X-Request-Id": "prio", "X-Priority": "low"}
    assert http.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    generate = worker.wait_generate("prio.")
    assert generate is not None and generate.priority == "low"


def test_text_parts_and_tools_reach_the_worker(http: httpx.Client, worker: ScriptedWorker) -> None:
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello"}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}], "tools": [tool]}
    http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "parts"})
    generate = worker.wait_generate("parts.")
    assert generate is not None
    assert generate.prompt == ChatPrompt(
        messages=[{"role": "user", "content": "Say hello"}], tools=[tool]
    )


def test_null_optional_fields_mean_default(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": HELLO,
        "temperature": None,
        "max_tokens": None,
        "stop": None,
        "stream": None,
        "logprobs": None,
        "n": None,
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY


def test_gateway_import_does_not_pull_mlx() -> None:
    code = "import sys, mlxd.gateway.app; sys.exit('mlx' in sys.modules or 'mlx_lm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_empty_completion_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "EMPTY"}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True))  # type: ignore[arg-type]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "stop"
