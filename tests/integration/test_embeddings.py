"""/v1/embeddings in the gateway against the scripted worker: request validation, both
encodings, usage, and worker errors as HTTP statuses."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.scripted_worker import MODEL

URL = "/v1/embeddings"


@pytest.fixture
def oai(gateway: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def test_inputs_in_order_with_usage(oai: openai.OpenAI) -> None:
    resp = oai.embeddings.create(
        model=MODEL, input=["one", "two words", "three more words"], encoding_format="float"
    )
    assert [d.embedding[0] for d in resp.data] == [1.0, 2.0, 3.0]
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == 6


@pytest.mark.parametrize(
    ("inputs", "sizes"), [("a b", [2]), ([5, 6, 7], [3]), ([[5], [6, 7]], [1, 2]), (["x"], [1])]
)
def test_every_input_shape(http: httpx.Client, inputs: Any, sizes: list[int]) -> None:
    body = http.post(URL, json={"model": MODEL, "input": inputs}).json()
    assert [d["embedding"][0] for d in body["data"]] == sizes
    assert body["object"] == "list" and body["model"] == MODEL


def test_base64_is_little_endian_float32(http: httpx.Client) -> None:
    body = http.post(URL, json={"model": MODEL, "input": "a b c", "encoding_format": "base64"})
    raw = base64.b64decode(body.json()["data"][0]["embedding"])
    assert struct.unpack("<4f", raw) == (3.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": [""]}, "input[0]"),
        ({"model": MODEL, "input": ["a", 3.5]}, "input[1]"),
        ({"model": MODEL, "input": [[1], [-1]]}, "input[1]"),
        ({"model": MODEL, "input": ["a"] * 2049}, "input"),
        ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "a", "dimensions": 8}, "dimensions"),
        ({"model": MODEL, "input": "a", "frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_body_is_a_400_naming_the_field(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = http.post(URL, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_worker_errors_keep_their_status(http: httpx.Client) -> None:
    response = http.post(URL, json={"model": MODEL, "input": ["ok", "ERROR:overloaded"]})
    assert response.status_code == 429
    assert http.post(URL, json={"model": "nope", "input": "x"}).status_code == 404
