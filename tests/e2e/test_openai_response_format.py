"""response_format through the official openai client on a tiny random-weight model: the
constraint, not the model, makes the output valid, while unconstrained requests share the batch."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from tests.e2e.conftest import Daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture
def daemon(shared_daemon: Daemon) -> Daemon:
    return shared_daemon


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
}


def _ask(daemon: Daemon, i: int) -> tuple[str | None, Any]:
    kwargs: dict[str, Any] = {"response_format": FORMAT, "seed": i} if i % 2 == 0 else {}
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=[{"role": "user", "content": f"person {i}"}],
        max_tokens=160,
        temperature=1.0,
        **kwargs,
    )
    return resp.choices[0].message.content, resp.choices[0].finish_reason


def test_json_schema_output_validates_in_a_mixed_batch(daemon: Daemon) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: _ask(daemon, i), range(6)))
    for i in range(0, 6, 2):
        text, reason = results[i]
        assert reason == "stop", text
        jsonschema.validate(json.loads(text or ""), SCHEMA)
    free = [results[i][0] for i in range(1, 6, 2)]
    assert not all(_is_json(t) for t in free)  # the others were not constrained


def test_json_schema_streamed(daemon: Daemon) -> None:
    stream = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=160,
        response_format=FORMAT,
        stream=True,  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object(daemon: Daemon) -> None:
    # A random model rarely closes a string on its own: nudge '"' and '}' up; the grammar still
    # decides where they may go.
    vocab = Tokenizer.from_file(str(daemon.model_path / "tokenizer.json")).get_vocab()
    bias = {str(vocab[t]): 30 for t in ('"', "}")}
    resp = client(daemon).chat.completions.create(
        model=daemon.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
        logit_bias=bias,
    )
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(resp.choices[0].message.content or ""), dict)


def test_invalid_schema_is_a_400_naming_the_field(daemon: Daemon) -> None:
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": 5}}},
    }
    with pytest.raises(openai.BadRequestError) as info:
        client(daemon).chat.completions.create(
            model=daemon.model,
            messages=[{"role": "user", "content": "hi"}],
            response_format=bad,  # type: ignore[arg-type]
        )
    assert info.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except ValueError:
        return False
    return True
