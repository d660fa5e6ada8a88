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
from collections.abc import Callable
from typing import Any

import msgpack  # type: ignore[import-untyped]

from mlxd.errors import InvalidRequest, ProtocolError
from mlxd.protocol import messages
from mlxd.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Message

MAX_FRAME_BYTES = 64 * 1024 * 1024

_TOP_LEVEL: dict[str, type] = {cls.TAG: cls for cls in MESSAGE_TYPES}  # type: ignore[attr-defined]


# Public API


def encode(msg: Message) -> list[bytes]:
    """Return the frame set for ``msg``: ``[PROTOCOL_VERSION, body]``.

    Raises:
        InvalidRequest: a value msgpack cannot hold (an int beyond 64 bits, a str with lone
            surrogates, as JSON allows), so the gateway answers 400 instead of crashing.
    """
    try:
        return [PROTOCOL_VERSION, msgpack.packb(to_wire(msg), use_bin_type=True)]
    except (OverflowError, ValueError, TypeError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidRequest(f"The request holds a value that cannot be sent on: {exc}") from None


def decode(frames: list[bytes]) -> Message:
    """Parse a frame set produced by ``encode``; raise ``ProtocolError`` on anything else."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames, got {len(frames)}")
    version, body = bytes(frames[0]), bytes(frames[1])
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol version {version[:32]!r} (this side speaks "
            f"{PROTOCOL_VERSION!r}: gateway and worker from different mlxd versions?)"
        )
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError("frame too large")
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: a map as a key
        raise ProtocolError(f"malformed msgpack body: {exc}") from None
    return from_wire(obj)  # type: ignore[no-any-return]


def to_wire(value: Any) -> Any:
    """Turn a message (or any nested value) into msgpack-ready builtins."""
    cls = type(value)
    if cls in _PLAIN:
        return value
    if cls is list or cls is tuple:
        return [to_wire(v) for v in value]
    if cls is dict:
        return {k: to_wire(v) for k, v in value.items()}
    layout = _LAYOUTS.get(cls)
    if layout is None:
        if not dataclasses.is_dataclass(value):
            return value
        layout = _LAYOUTS[cls] = _layout(cls)
    tag, names = layout
    out: dict[str, Any] = {"type": tag} if tag is not None else {}
    for name in names:
        out[name] = to_wire(getattr(value, name))
    return out


_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})
_LAYOUTS: dict[type, tuple[str | None, tuple[str, ...]]] = {}  # dataclass -> (tag, field names)


def from_wire(obj: Any) -> Any:
    """Build the top-level message named by ``obj["type"]``."""
    if not isinstance(obj, dict):
        raise ProtocolError("message body must be a map")
    tag = obj.get("type")
    cls = _TOP_LEVEL.get(tag) if isinstance(tag, str) else None  # a list tag is unhashable
    if cls is None:
        raise ProtocolError(f"unknown message type {str(obj.get('type'))[:64]!r}")
    return _converter(cls)(obj, "")


# Internal helpers
#
# Each type gets one converter, built once: decoding a message walks prebuilt closures instead of
# inspecting type hints for every value.

Converter = Callable[[Any, str], Any]


def _layout(cls: type) -> tuple[str | None, tuple[str, ...]]:
    return getattr(cls, "TAG", None), tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _converter(tp: Any) -> Converter:
    origin = typing.get_origin(tp)
    if tp is Any:
        return lambda value, path: value
    if origin in (typing.Union, types.UnionType):
        return _union_converter(typing.get_args(tp))
    if origin is list:
        return _list_converter(_converter(typing.get_args(tp)[0]))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        return _dict_converter(_converter(kt), _converter(vt))
    if dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)  # type: ignore[arg-type]
    return _scalar_converter(tp)


def _dataclass_converter(cls: type) -> Converter:
    hints = typing.get_type_hints(cls, vars(messages))
    fields = [
        (f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    ]
    allowed = {name for name, _ in fields} | {"type"}
    # Field converters are looked up on first use, not here: a message may nest its own type.
    # Looking them up per value cost more than the rest of decoding (hashing union hints).
    resolved: list[tuple[str, bool, Converter]] = []

    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{path or cls.__name__}: expected a map")
        if not allowed.issuperset(value):
            extra = sorted(map(str, set(value) - allowed))[0]
            raise ProtocolError(f"{path or cls.__name__}: unknown field {extra!r}")
        if len(resolved) < len(fields):
            resolved[:] = [(name, req, _converter(hints[name])) for name, req in fields]
        kwargs = {}
        for name, required, field in resolved:
            if name in value:
                kwargs[name] = field(value[name], f"{path}.{name}" if path else name)
            elif required:
                raise ProtocolError(f"{f'{path}.{name}' if path else name}: missing field")
        return cls(**kwargs)

    return convert


def _list_converter(item: Converter) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise ProtocolError(f"{path}: expected a list")
        return [item(v, path) for v in value]

    return convert


def _dict_converter(key: Converter, val: Converter) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{path}: expected a map")
        return {key(k, path): val(v, f"{path}[{k!r}]") for k, v in value.items()}

    return convert


def _union_converter(args: tuple[Any, ...]) -> Converter:
    nullable = type(None) in args
    tagged = {a.TAG: a for a in args if dataclasses.is_dataclass(a) and hasattr(a, "TAG")}
    others = [a for a in args if a is not type(None) and a not in tagged.values()]

    def convert(value: Any, path: str) -> Any:
        if value is None:
            if nullable:
                return None
            raise ProtocolError(f"{path}: must not be null")
        if tagged:
            tag = value.get("type") if isinstance(value, dict) else None
            if not isinstance(tag, str) or tag not in tagged:
                raise ProtocolError(f"{path}: expected one of {sorted(tagged)}")
            return _converter(tagged[tag])(value, path)  # type: ignore[arg-type]
        return _converter(others[0])(value, path)

    return convert


def _scalar_converter(tp: Any) -> Converter:
    accepts: dict[Any, Callable[[Any], bool]] = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        bytes: lambda v: isinstance(v, bytes),
    }
    if tp not in accepts:  # pragma: no cover - messages.py uses only the types above
        raise ProtocolError(f"unsupported type {tp!r}")
    ok, cast = accepts[tp], float if tp is float else None

    def convert(value: Any, path: str) -> Any:
        if not ok(value):
            raise ProtocolError(f"{path}: expected {tp.__name__}, got {type(value).__name__}")
        return cast(value) if cast is not None else value

    return convert
