"""response_format on the batching engine: constrained rows give valid JSON, the others are
untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxd.protocol.messages import JsonFormat

pytestmark = pytest.mark.model

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


def check(doc: dict[str, Any]) -> None:
    assert set(doc) == {"name", "age", "tags", "ok"}
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 6
    assert type(doc["age"]) is int and 0 <= doc["age"] <= 120
    assert set(doc["tags"]) <= {"a", "b"} and len(doc["tags"]) <= 3
    assert type(doc["ok"]) is bool


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_rows_are_valid_and_free_rows_unchanged(
    harness_factory: Any, temperature: float
) -> None:
    fmt = JsonFormat(schema=json.dumps(SCHEMA))
    h = harness_factory()
    h.generate("free-alone", "hello world", max_tokens=12, ignore_eos=True)
    alone = h.run()["free-alone"].token_ids
    for i in range(3):
        h.generate(
            f"json{i}",
            f"person {i}:",
            max_tokens=160,
            temperature=temperature,
            seed=i,
            response_format=fmt,
        )
    h.generate("free", "hello world", max_tokens=12, ignore_eos=True)
    results = h.run()
    assert results["free"].token_ids == alone
    for i in range(3):
        res = results[f"json{i}"]
        assert res.finished is not None and res.finished.finish_reason == "stop", res.text
        check(json.loads(res.text))


def test_json_object_gives_an_object(harness_factory: Any) -> None:
    h = harness_factory()
    h.generate("r", "data:", max_tokens=200, response_format=JsonFormat())
    res = h.run()["r"]
    assert res.finished is not None and res.finished.finish_reason == "stop"
    assert isinstance(json.loads(res.text), dict)


def test_invalid_schema_is_refused_naming_the_field(harness_factory: Any) -> None:
    h = harness_factory()
    bad = JsonFormat(schema=json.dumps({"type": "object", "properties": {"a": {"type": "nope"}}}))
    h.generate("r", "x", max_tokens=4, response_format=bad)
    err = h.results["r"].error
    assert err is not None and err.code == "invalid_request"
    assert err.param == "response_format.json_schema.schema" and "nope" in err.message


@pytest.mark.parametrize("field", ["ignore_eos", "min_tokens"])
def test_settings_that_forbid_the_end_are_refused(harness_factory: Any, field: str) -> None:
    h = harness_factory()
    value: Any = True if field == "ignore_eos" else 3
    h.generate("r", "x", max_tokens=8, response_format=JsonFormat(), **{field: value})
    err = h.results["r"].error
    assert err is not None and err.code == "invalid_request" and err.param == field
