"""The Responses ``response`` object: its fixed fields, its output items and usage, and how a
finished one is kept in the store (``store: true``)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from mlxd.gateway.surfaces.responses.items import new_item_id, to_messages
from mlxd.gateway.surfaces.responses.schemas import ResponsesRequest
from mlxd.gateway.surfaces.responses.store import ResponseStore
from mlxd.gateway.surfaces.responses.tools import CUSTOM_INPUT
from mlxd.gateway.tools.calls import ToolCall
from mlxd.protocol.messages import Usage


def usage_body(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The Responses ``usage``: ``cached_tokens`` are the prompt tokens the prefix cache served,
    ``reasoning_tokens`` the output tokens inside thinking."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def text_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    """A ``reasoning_text`` content part."""
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """A ``reasoning`` item holding the model's thinking as ``reasoning_text`` (OpenAI's
    convention for open-weight models: no summary, no encrypted content); ``None`` text: no
    content part yet."""
    content = [] if text is None else [reasoning_part(text)]
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` item; ``None`` text: no content part yet."""
    content = [] if text is None else [text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(
    item_id: str, call: ToolCall, custom: frozenset[str], done: bool = True
) -> dict[str, Any]:
    """A ``function_call`` item, or a ``custom_tool_call`` one for a custom tool (its input
    as the freeform text); not ``done``: as it starts, before its arguments."""
    if call.name in custom:
        text = custom_input(call.arguments) if done else ""
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "call_id": call.id,
            "name": call.name,
            "input": text,
        }
    return {
        "id": item_id,
        "type": "function_call",
        "status": "completed" if done else "in_progress",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if done else "",
    }


def custom_input(arguments: str) -> str:
    """A custom tool call's freeform input: its one string argument (the raw arguments when
    the model wrote something else)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def output_items(
    text: str, calls: list[ToolCall], custom: frozenset[str], reasoning: str = ""
) -> list[dict[str, Any]]:
    """A whole answer's output items: its thinking (if any), its text (unless blank beside
    calls), then its calls."""
    items = [reasoning_item(new_item_id("reasoning"), reasoning)] if reasoning else []
    if not (calls and not text.strip()):
        items.append(message_item(new_item_id("message"), text))
    return items + [call_item(call_item_id(c, custom), c, custom) for c in calls]


def call_item_id(call: ToolCall, custom: frozenset[str]) -> str:
    """A fresh id for ``call``'s item."""
    return new_item_id("custom_tool_call" if call.name in custom else "function_call")


def status_of(finish_reason: str) -> tuple[str, dict[str, Any] | None]:
    """A response's ``status`` and ``incomplete_details`` for how its output ended."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


class ResponseShell:
    """One response's fixed fields (id, model, the request's echoed settings) and its end.

    Args:
        parsed: the request.
        store: where a finished response is kept, if the request asks.
    """

    def __init__(self, parsed: ResponsesRequest, store: ResponseStore) -> None:
        self.id = f"resp_{secrets.token_hex(16)}"
        self.created_at = int(time.time())
        self.parsed = parsed
        self.store = store

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        reasoning_tokens: int = 0,
    ) -> dict[str, Any]:
        """The ``response`` object as it stands."""
        spec = self.parsed.spec
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.parsed.model,
            "output": output,
            **spec.echo,
            "store": spec.store,
            "usage": None if usage is None else usage_body(usage, reasoning_tokens),
        }

    def finish(
        self,
        output: list[dict[str, Any]],
        usage: Usage,
        finish_reason: str,
        reasoning_tokens: int = 0,
    ) -> dict[str, Any]:
        """The finished response object, kept in the store if the request asked."""
        status, incomplete = status_of(finish_reason)
        response = self.object(status, output, usage, incomplete, None, reasoning_tokens)
        response["completed_at"] = int(time.time())
        spec = self.parsed.spec
        if spec.store:
            conversation = spec.history + to_messages(output, set())
            self.store.put(response, spec.input_items, conversation)
        return response
