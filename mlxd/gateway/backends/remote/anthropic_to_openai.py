"""A ``/v1/messages`` client on an ``openai``-kind backend: the Messages request as a chat
completion, the completion (or its chunks) back as a message (or Anthropic's events).

The request goes through the same checks and mapping as the local path
(``anthropic.schemas.to_openai_chat``) and the answer through the same renderers
(``anthropic.events``), so the two cannot drift. ``top_k`` has no OpenAI equivalent and is a
400. OpenAI does not say which stop sequence matched, so a stop is always ``end_turn``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.anthropic.events import message_body, stop_reason, usage_body
from mlxd.gateway.surfaces.anthropic.schemas import to_openai_chat
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.tools.calls import ToolCall
from mlxd.protocol.messages import Usage

_DONE = "[DONE]"
_Event = tuple[str, str]  # (SSE event name, its JSON data)


def request(body: Any, upstream_model: str) -> dict[str, Any]:
    """The chat completion request for a Messages ``body``.

    Raises:
        InvalidRequest: a field the OpenAI API cannot carry, or a bad Messages field.
    """
    if isinstance(body, dict) and body.get("top_k") is not None:
        raise InvalidRequest(
            "'top_k' cannot be sent to an OpenAI-compatible backend", param="top_k"
        )
    chat = {k: v for k, v in to_openai_chat(body).items() if v is not None}
    chat["model"] = upstream_model
    chat["messages"] = [_wire_message(m) for m in chat["messages"]]
    user = (body.get("metadata") or {}).get("user_id")
    if user is not None:
        chat["user"] = user
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def response(payload: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``message`` for a chat completion.

    Raises:
        ValueError: not the shape of a chat completion.
    """
    try:
        choice = payload["choices"][0]
        message = choice["message"]
        calls = [_tool_call(c) for c in message.get("tool_calls") or ()]
        result = ChoiceResult(
            text=message.get("content") or "",
            tool_calls=calls,
            finish_reason=choice.get("finish_reason") or "stop",
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a chat completion: {exc!r}") from None
    return message_body(_message_id(), model, result, _usage(payload.get("usage")))


async def events(chunks: AsyncIterator[str], model: str) -> AsyncIterator[_Event]:
    """Anthropic's events for the ``data`` of an OpenAI stream (``stream_options.include_usage``
    on, so the totals come last): ``message_start`` with the first chunk, ``message_delta``
    and ``message_stop`` at ``[DONE]``; a stream cut before its finish ends in ``error``."""
    blocks = _Blocks()
    async for data in chunks:
        if data == _DONE:
            break
        try:
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise ValueError("not an object")
        except ValueError:
            yield _error("the backend sent an event that is not JSON")
            return
        if blocks.num_chunks == 0:
            yield _event("message_start", message=_start(model))
        if isinstance(chunk.get("error"), dict):
            yield _error(str(chunk["error"].get("message", "")))
            return
        for item in blocks.add(chunk):
            yield item
    if blocks.num_chunks == 0:
        return
    if blocks.finish_reason is None:
        yield _error("the backend ended its stream unfinished")
        return
    for item in blocks.finish():
        yield item


class _Blocks:
    """Content blocks as chunks arrive: text opens a text block, each tool call (by its OpenAI
    ``index``) a ``tool_use`` block; OpenAI streams them one after another."""

    def __init__(self) -> None:
        self.num_chunks = 0
        self.finish_reason: str | None = None
        self._index = -1
        self._open: str | None = None  # "text", or the OpenAI index of the open tool call
        self._num_calls = 0
        self._usage = Usage(prompt_tokens=0, completion_tokens=0)

    def add(self, chunk: dict[str, Any]) -> list[_Event]:
        self.num_chunks += 1
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        out: list[_Event] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return out

    def finish(self) -> list[_Event]:
        reason = stop_reason(self.finish_reason or "stop", None, self._num_calls > 0)
        delta = {"stop_reason": reason, "stop_sequence": None}
        usage = usage_body(self._usage)
        return [
            *self._close(),
            _event("message_delta", delta=delta, usage=usage),
            _event("message_stop"),
        ]

    def _text(self, text: str) -> list[_Event]:
        out = [] if self._open == "text" else self._start("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [*out, _event("content_block_delta", index=self._index, delta=delta)]

    def _call(self, call: dict[str, Any]) -> list[_Event]:
        function = call.get("function") or {}
        out: list[_Event] = []
        if self._open != f"call {call.get('index')}":
            block = {
                "type": "tool_use",
                "id": _tool_use_id(call.get("id")),
                "name": function.get("name", ""),
                "input": {},
            }
            out = self._start(f"call {call.get('index')}", block)
            self._num_calls += 1
        if function.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(_event("content_block_delta", index=self._index, delta=delta))
        return out

    def _start(self, kind: str, block: dict[str, Any]) -> list[_Event]:
        out = self._close()
        self._index += 1
        self._open = kind
        return [*out, _event("content_block_start", index=self._index, content_block=block)]

    def _close(self) -> list[_Event]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._index)]


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    # The local path keeps tool-call arguments as objects; on the wire they are JSON text.
    # Replayed thinking stays here: OpenAI's API has no field for it.
    message = {k: v for k, v in message.items() if k != "reasoning_content"}
    calls = message.get("tool_calls")
    if not calls:
        return message
    wired = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        for c in calls
    ]
    return {**message, "tool_calls": wired}


def _tool_call(call: dict[str, Any]) -> ToolCall:
    function = call["function"]
    json.loads(function["arguments"])  # a tool_use block's input must be an object
    return ToolCall(
        id=str(call["id"]), name=str(function["name"]), arguments=str(function["arguments"])
    )


def _tool_use_id(call_id: Any) -> str:
    text = str(call_id) if call_id else secrets.token_hex(12)
    return f"toolu_{text.removeprefix('call_')}"


def _start(model: str) -> dict[str, Any]:
    # OpenAI reports usage only at the end: message_delta carries the prompt's tokens too.
    return {
        "id": _message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_body(Usage(prompt_tokens=0, completion_tokens=0)),
    }


def _usage(usage: Any) -> Usage:
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def _event(name: str, **data: Any) -> _Event:
    return name, json.dumps({"type": name, **data}, ensure_ascii=False, separators=(",", ":"))


def _error(message: str) -> _Event:
    return _event("error", error={"type": "api_error", "message": message})
