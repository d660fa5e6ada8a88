"""Property-based fuzzing of ``codec.decode``: whatever arrives, the answer is a message or a
``ProtocolError``, never another exception (a worker must survive any frame set)."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION
from tests.unit.test_codec import MESSAGES

TAGS = [cls.TAG for cls in MESSAGE_TYPES]  # type: ignore[attr-defined]
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
keys = st.sampled_from(["type", "request_id", "prompt", "sampling", "events", "text"]) | scalars
values = st.recursive(
    scalars | st.sampled_from(TAGS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


def decodes_or_rejects(frames: list[bytes]) -> None:
    try:
        codec.decode(frames)
    except ProtocolError:
        pass


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_any_frames(frames: list[bytes]) -> None:
    decodes_or_rejects(frames)


@FUZZ
@given(st.binary(max_size=256))
def test_any_body_bytes(body: bytes) -> None:
    decodes_or_rejects([PROTOCOL_VERSION, body])


@FUZZ
@given(st.sampled_from(TAGS), st.dictionaries(keys, values, max_size=6))
def test_any_fields_under_a_real_tag(tag: str, fields: dict[Any, Any]) -> None:
    decodes_or_rejects([PROTOCOL_VERSION, pack({**fields, "type": tag})])


@FUZZ
@given(values)
def test_any_msgpack_value(value: Any) -> None:
    decodes_or_rejects([PROTOCOL_VERSION, pack(value)])


@FUZZ
@given(st.sampled_from(MESSAGES), st.data())
def test_one_field_of_a_real_message_replaced(msg: Any, data: st.DataObject) -> None:
    wire = codec.to_wire(msg)
    target = data.draw(st.sampled_from(sorted(_paths(wire), key=repr)))
    _set(wire, target, data.draw(values))
    decodes_or_rejects([PROTOCOL_VERSION, pack(wire)])


@FUZZ
@given(st.sampled_from(MESSAGES), st.integers(0, 400), st.binary(min_size=1, max_size=4))
def test_real_message_with_bytes_spliced(msg: Any, at: int, junk: bytes) -> None:
    body = codec.encode(msg)[1]
    at = at % len(body)
    decodes_or_rejects([PROTOCOL_VERSION, body[:at] + junk + body[at + len(junk) :]])


def test_deeply_nested_body_is_rejected() -> None:
    deep: Any = "x"
    for _ in range(400):  # msgpack's packer stops at 512 levels
        deep = [deep]
    body = b"\x91" * 100_000 + b"\xc0"  # 100k nested one-element arrays
    decodes_or_rejects([PROTOCOL_VERSION, body])
    decodes_or_rejects([PROTOCOL_VERSION, pack({"type": "ping", "request_id": deep})])


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value
