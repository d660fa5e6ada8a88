"""Encode messages to msgpack frames and decode them back, validating every field.

Decoding rejects, with ``ProtocolError`` and before any handler runs: a wrong frame count, an
unknown protocol version, bytes that are not msgpack, an unknown message type, missing or unknown
fields and values of the wrong type. No pickle, ever.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import msgpack

from mlxd.errors import ProtocolError
from mlxd.protocol import messages
from mlxd.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Message

MAX_FRAME_BYTES = 64 * 1024 * 1024

_TOP_LEVEL: dict[str, type] = {cls.TAG: cls for cls in MESSAGE_TYPES}  # type: ignore[attr-defined]


# Public API


def encode(msg: Message) -> list[bytes]:
    """Return the frame set for ``msg``: ``[PROTOCOL_VERSION, body]``."""
    return [PROTOCOL_VERSION, msgpack.packb(to_wire(msg), use_bin_type=True)]


def decode(frames: list[bytes]) -> Message:
    """Parse a frame set produced by ``encode``; raise ``ProtocolError`` on anything else."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames, got {len(frames)}")
    version, body = bytes(frames[0]), bytes(frames[1])
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version[:32]!r}")
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError("frame too large")
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed msgpack body: {exc}") from None
    return from_wire(obj)  # type: ignore[no-any-return]


def to_wire(value: Any) -> Any:
    """Turn a message (or any nested value) into msgpack-ready builtins."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        tag = getattr(type(value), "TAG", None)
        if tag is not None:
            out["type"] = tag
        for f in dataclasses.fields(value):
            out[f.name] = to_wire(getattr(value, f.name))
        return out
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


def from_wire(obj: Any) -> Any:
    """Build the top-level message named by ``obj["type"]``."""
    if not isinstance(obj, dict):
        raise ProtocolError("message body must be a map")
    cls = _TOP_LEVEL.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message type {str(obj.get('type'))[:64]!r}")
    return _build(cls, obj, "")


# Internal helpers


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(messages))


def _build(cls: type, obj: Any, path: str) -> Any:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{path or cls.__name__}: expected a map")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(obj) - names - {"type"}
    if extra:
        raise ProtocolError(f"{path or cls.__name__}: unknown field {sorted(map(str, extra))[0]!r}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in obj:
            kwargs[f.name] = _convert(hints[f.name], obj[f.name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field")
    return cls(**kwargs)


def _convert(tp: Any, value: Any, path: str) -> Any:  # noqa: C901 - one branch per type form
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _convert_union(typing.get_args(tp), value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{path}: expected a list")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{path}: expected a map")
        kt, vt = typing.get_args(tp)
        return {_convert(kt, k, path): _convert(vt, v, f"{path}[{k!r}]") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)  # type: ignore[arg-type]
    return _convert_scalar(tp, value, path)


def _convert_union(args: tuple[Any, ...], value: Any, path: str) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise ProtocolError(f"{path}: must not be null")
    tagged = {getattr(a, "TAG", None): a for a in args if dataclasses.is_dataclass(a)}
    tagged.pop(None, None)
    if tagged:
        if not isinstance(value, dict) or value.get("type") not in tagged:
            raise ProtocolError(f"{path}: expected one of {sorted(tagged)}")
        return _build(tagged[value["type"]], value, path)
    for arg in args:
        if arg is not type(None):
            return _convert(arg, value, path)
    raise ProtocolError(f"{path}: no matching type")  # pragma: no cover - unions always have one


def _convert_scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is bytes:
        if isinstance(value, bytes):
            return value
    else:  # pragma: no cover - messages.py uses only the types above
        raise ProtocolError(f"{path}: unsupported type {tp!r}")
    raise ProtocolError(f"{path}: expected {tp.__name__}, got {type(value).__name__}")
