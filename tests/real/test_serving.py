"""SmolLM2 served from its GGUF file through `mlxd start`, asked with the official openai client:
real answers, its own chat template, EOS, tool calls, JSON schemas and streaming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.real.conftest import MODEL, OLLAMA_MODEL

pytestmark = [pytest.mark.real]

MAX_TOKENS = 24
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(real_daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_daemon.base_url}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("max_tokens", MAX_TOKENS)
    return client.chat.completions.create(
        model=kw.pop("model", MODEL), messages=messages, temperature=0, **kw
    )


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("What is the capital of France?", "Paris"),
        ("What is the capital of Germany?", "Berlin"),
        ("How many days are in a week?", "7"),
    ],
)
def test_answers_facts_and_stops_at_eos(client: openai.OpenAI, question: str, answer: str) -> None:
    reply = ask(client, [{"role": "user", "content": question}])
    assert answer in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"  # <|im_end|> (the GGUF's EOS), not the cap
    assert reply.usage.completion_tokens < MAX_TOKENS


def test_the_gguf_chat_template_is_applied(client: openai.OpenAI, converted_dir: Path) -> None:
    from tokenizers import Tokenizer

    # ChatML with SmolLM's default system prompt: the template stored in the GGUF metadata.
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tokenizer = Tokenizer.from_file(str(converted_dir / "tokenizer.json"))
    reply = ask(client, FRANCE, max_tokens=1)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(text).ids)


def test_matches_mlx_lm_greedy_on_the_converted_model(
    client: openai.OpenAI, converted_dir: Path
) -> None:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(converted_dir))[:2]
    prompt = tokenizer.apply_chat_template(FRANCE, add_generation_prompt=True)
    expected = mlx_lm.generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS)
    assert expected == "The capital of France is Paris."
    assert ask(client, FRANCE).choices[0].message.content == expected


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    whole = ask(client, FRANCE).choices[0].message.content
    chunks = ask(client, FRANCE, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_a_tool_call_is_valid(client: openai.OpenAI) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = ask(client, messages, tools=[tool], tool_choice="required", max_tokens=40)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_a_json_schema_response_is_valid_json(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "country": {"type": "string", "maxLength": 16},
            "capital": {"type": "string", "maxLength": 16},
        },
        "required": ["country", "capital"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "Give the capital of France as JSON."}]
    reply = ask(client, messages, response_format=fmt, max_tokens=40)
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_an_ollama_store_model_is_served(client: openai.OpenAI) -> None:
    reply = ask(client, FRANCE, model=OLLAMA_MODEL)
    assert reply.choices[0].message.content == "The capital of France is Paris."
