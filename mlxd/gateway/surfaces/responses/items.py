"""Responses items: a request's ``input`` checked and listed, and items as chat messages.

Input and output items share one mapping to the chat messages the template renders: a
``message`` is a message (``developer`` as ``system``), a ``function_call`` or
``custom_tool_call`` is a tool call of the assistant message before it (ids kept), a
``function_call_output`` or ``custom_tool_call_output`` is a ``tool`` message, and a
``reasoning`` item's ``reasoning_text`` is the ``reasoning_content`` of the assistant turn that
follows it (a template with a place for it, such as Qwen3's, renders it; others drop it, as
they drop a reasoning item without text: a summary or encrypted content). So a client that
sends a response's output back as input (``store: false``, as Codex does) renders the same
prompt as one that continues it with ``previous_response_id``, and the prefix cache hits both.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.responses.tools import CUSTOM_INPUT

_ROLES = ("system", "developer", "user", "assistant")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = ("input_file", "input_audio")
_CALLS = ("function_call", "custom_tool_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "custom_tool_call": "ctc",
    "reasoning": "rs",
}


def new_item_id(kind: str) -> str:
    """A fresh item id (``msg_...``, ``fc_...``, ``ctc_...``, ``rs_...``)."""
    return f"{_ID_PREFIX.get(kind, 'item')}_{secrets.token_hex(12)}"


def input_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as a list of checked items, each with an ``id`` (a string is one user
    message)."""
    if isinstance(value, str):
        part = {"type": "input_text", "text": value}
        return [
            {"id": new_item_id("message"), "type": "message", "role": "user", "content": [part]}
        ]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", param="input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def to_messages(items: list[dict[str, Any]], calls: set[str]) -> list[dict[str, Any]]:
    """Checked items as chat messages. ``calls`` holds the call ids of the conversation so far;
    this adds the items' own. A tool output whose call is not among them is a 400."""
    out: list[dict[str, Any]] = []
    thought: list[str] = []  # reasoning text waiting for the assistant turn it precedes
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "reasoning":
            thought += [reasoning_text(item)]
            continue
        if kind == "message":
            out.append({"role": _role(item["role"]), "content": _content(item["content"])})
        elif kind in _CALLS:
            _add_call(out, _tool_call(item, f"input[{i}]"))
            calls.add(item["call_id"])
        elif kind in _OUTPUTS:
            if item["call_id"] not in calls:
                raise InvalidRequest(
                    f"No tool call found for {kind} with call_id {item['call_id']!r}",
                    param=f"input[{i}].call_id",
                )
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        thought = _with_reasoning(out[-1], thought)
    return out


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's thinking text: its ``reasoning_text`` parts (a summary is not the
    thinking, and encrypted content is OpenAI's)."""
    parts = item.get("content") or []
    return "".join(p["text"] for p in parts if p.get("type") == "reasoning_text")


def call_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls in chat ``messages``."""
    return {c["id"] for m in messages for c in m.get("tool_calls") or ()}


# Internal helpers: checking items


def _item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    checks = {
        "message": _message,
        "function_call": _function_call,
        "custom_tool_call": _custom_tool_call,
        "function_call_output": _call_output,
        "custom_tool_call_output": _call_output,
        "reasoning": _reasoning,
    }
    if kind not in checks:
        raise InvalidRequest(
            f"'{where}.type' {kind!r} is not supported: use message, function_call, "
            "function_call_output, custom_tool_call, custom_tool_call_output or reasoning",
            param=f"{where}.type",
        )
    checked = checks[kind]({**item, "type": kind}, where)
    return {"id": new_item_id(kind), **checked}


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"'{where}.role' must be one of {', '.join(_ROLES)}", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        return {**item, "content": [{"type": kind, "text": content}]}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"'{where}.content' must be a string or a list of parts", param=f"{where}.content"
        )
    for j, part in enumerate(content):
        _part(part, f"{where}.content[{j}]", images=role == "user")
    return item


def _part(part: Any, where: str, images: bool = False) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_image" and images:
        _image(part, where)
        return
    if kind in _MEDIA_PARTS or kind == "input_image":
        raise InvalidRequest(f"'{where}': {kind} is not supported yet", param=f"{where}.type")
    if kind not in _TEXT_PARTS:
        raise InvalidRequest(
            f"'{where}.type' must be input_text, output_text or refusal", param=f"{where}.type"
        )
    _str(part, _TEXT_PARTS[kind], where)


def _image(part: dict[str, Any], where: str) -> None:
    """An ``input_image``: its ``image_url`` (a data: or http(s) URL; checked by the chat
    parser); a ``file_id`` (the Files API) is not served here."""
    if part.get("file_id") is not None:
        raise InvalidRequest(
            f"'{where}.file_id': uploaded files are not supported; send image_url",
            param=f"{where}.file_id",
        )
    url = _str(part, "image_url", where)
    if not url.startswith(("data:", "http://", "https://")):
        raise InvalidRequest(
            f"'{where}.image_url' must be a data: or http(s) URL", param=f"{where}.image_url"
        )


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        _str(item, key, where)
    return item


def _custom_tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "input"):
        _str(item, key, where)
    return item


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    _str(item, "call_id", where)
    output = item.get("output")
    if isinstance(output, list):
        for j, part in enumerate(output):
            _part(part, f"{where}.output[{j}]")
        return {**item, "output": _text(output)}
    _str(item, "output", where)
    return item


def _reasoning(item: dict[str, Any], where: str) -> dict[str, Any]:
    """Accepted as sent back (``summary``, ``encrypted_content`` unread); its
    ``reasoning_text`` parts must hold text."""
    content = item.get("content")
    if content is None:
        return item
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}.content' must be a list", param=f"{where}.content")
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequest(
                f"'{where}.content[{j}]' must be an object", param=f"{where}.content[{j}]"
            )
        if part.get("type") == "reasoning_text":
            _str(part, "text", f"{where}.content[{j}]")
    return item


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    return value


# Internal helpers: items as messages


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's parts as chat content: its text, or with images its text and
    ``image_url`` parts in order."""
    if all(p["type"] != "input_image" for p in parts):
        return _text(parts)
    return [_chat_part(p) for p in parts]


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "input_image":
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    return {"type": "text", "text": str(part.get(_TEXT_PARTS[part["type"]], ""))}


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(str(p.get(_TEXT_PARTS[p["type"]], "")) for p in parts)


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    if item["type"] == "custom_tool_call":
        arguments: Any = {CUSTOM_INPUT: item["input"]}
    else:
        try:  # templates such as Qwen's apply tojson to the arguments: an object, not a string
            arguments = json.loads(item["arguments"] or "{}")
        except (ValueError, RecursionError):
            raise InvalidRequest(
                f"'{where}.arguments' is not valid JSON", param=f"{where}.arguments"
            ) from None
    function = {"name": item["name"], "arguments": arguments}
    return {"id": item["call_id"], "type": "function", "function": function}


def _with_reasoning(message: dict[str, Any], thought: list[str]) -> list[str]:
    """Reasoning items' text joins the assistant turn after them (another turn drops it);
    returns what still waits (nothing)."""
    text = "\n\n".join(t for t in thought if t)
    if text and message["role"] == "assistant" and "reasoning_content" not in message:
        message["reasoning_content"] = text
    return []


def _add_call(out: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """A call joins the assistant message just before it (its text, its other calls)."""
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
        return
    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
