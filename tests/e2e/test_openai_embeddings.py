"""/v1/embeddings through the official openai client: shape, determinism, unit length, and
batched inputs giving the same vectors as one at a time."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_openai_api import client

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture
def daemon(shared_daemon: Daemon) -> Daemon:
    return shared_daemon


TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog", "import os", "x"]


def _vectors(daemon: Daemon, inputs: object, **kwargs: object) -> np.ndarray:
    resp = client(daemon).embeddings.create(model=daemon.model, input=inputs, **kwargs)  # type: ignore[arg-type]
    assert [d.index for d in resp.data] == list(range(len(resp.data)))
    return np.array([d.embedding for d in resp.data])


def test_shape_usage_and_unit_length(daemon: Daemon) -> None:
    resp = client(daemon).embeddings.create(model=daemon.model, input=TEXTS)
    assert resp.object == "list" and resp.model == daemon.model and len(resp.data) == 4
    vectors = np.array([d.embedding for d in resp.data])
    assert vectors.shape == (4, 64)  # the tiny model's hidden size
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(TEXTS)
    assert not np.allclose(vectors[0], vectors[1])


def test_batched_equals_one_by_one_and_is_deterministic(daemon: Daemon) -> None:
    batched = _vectors(daemon, TEXTS)
    single = np.concatenate([_vectors(daemon, t) for t in TEXTS])
    assert np.allclose(batched, single, atol=1e-5)
    assert np.array_equal(batched, _vectors(daemon, TEXTS))


def test_token_inputs_and_float_encoding(daemon: Daemon) -> None:
    ids = [[9, 10, 11], [12, 13]]
    as_lists = _vectors(daemon, ids, encoding_format="float")
    assert np.allclose(as_lists[0], _vectors(daemon, ids[0], encoding_format="float")[0], atol=1e-5)
    body = {"model": daemon.model, "input": ids, "encoding_format": "base64"}
    raw = httpx.post(f"{daemon.base_url}/v1/embeddings", json=body)
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw.json()["data"]]
    assert np.allclose(decoded, as_lists, atol=1e-6)


@pytest.mark.parametrize(
    ("inputs", "param"),
    [([], "input"), ([""], "input[0]"), (["ok", [1, -2]], "input[1]"), ([[10**9]], "input[0]")],
)
def test_bad_input_is_a_400_naming_it(daemon: Daemon, inputs: object, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(daemon).embeddings.create(model=daemon.model, input=inputs)  # type: ignore[arg-type]
    assert info.value.body["param"] == param  # type: ignore[index]
