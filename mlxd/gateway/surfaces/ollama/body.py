"""Ollama's response objects: the chat ``message`` and generate ``response`` lines a stream is
made of, and the whole (``stream: false``) answer, which is the last line with all the text."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.tools.calls import ToolCall


def created_at() -> str:
    """Now, as Ollama writes its ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(data: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def tool_call(call: ToolCall) -> dict[str, Any]:
    """Ollama's ``tool_calls[]`` entry: no id, arguments as an object."""
    return {"function": {"name": call.name, "arguments": json.loads(call.arguments)}}


class ChatShape:
    """``/api/chat``: text, thinking and tool calls go in ``message``."""

    def part(
        self, model: str, text: str, calls: list[ToolCall], thinking: str = ""
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [tool_call(c) for c in calls]
        return {"model": model, "created_at": created_at(), "message": message, "done": False}


class GenerateShape:
    """``/api/generate``: text goes in ``response``, thinking in ``thinking`` (it parses no
    tool calls)."""

    def part(
        self, model: str, text: str, calls: list[ToolCall], thinking: str = ""
    ) -> dict[str, Any]:
        out = {"model": model, "created_at": created_at(), "response": text, "done": False}
        return {**out, "thinking": thinking} if thinking else out


Shape = ChatShape | GenerateShape


def last(
    shape: Shape, model: str, result: ChoiceResult, fields: dict[str, int], thinking: str = ""
) -> dict[str, Any]:
    """The final object: the text (all of it, unstreamed), ``done``, the reason and durations."""
    out = shape.part(model, result.text, result.tool_calls, thinking)
    return {**out, "done": True, "done_reason": result.finish_reason, **fields}


def model_only(model: str, is_chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a load (``reason`` ``load``) or unload (``unload``) request."""
    out: dict[str, Any] = {"model": model, "created_at": created_at()}
    if is_chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return {**out, "done": True, "done_reason": reason}
