"""A ``/v1/chat/completions`` client on an ``anthropic``-kind backend: the chat request as a
Messages request, the message (or its events) back as a chat completion (or its chunks).

What the Messages API cannot carry is a 400 naming the field, never dropped: more than one
choice (``n``), ``logprobs``, penalties, ``seed``, ``response_format``, a ``temperature`` above
1, a system message after the conversation started, non-text content. Anthropic requires
``max_tokens``: without one, ``DEFAULT_MAX_TOKENS`` is asked for.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from mlxd.errors import InvalidRequest

DEFAULT_MAX_TOKENS = 4096
_DONE = "[DONE]"
# OpenAI fields that need no counterpart: accepted as long as they ask for nothing.
_NEUTRAL = {
    "n": 1,
    "logprobs": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": {},
    "response_format": {"type": "text"},
}
_MAPPED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stream",
        "stream_options",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}


def request(body: dict[str, Any], upstream_model: str) -> dict[str, Any]:
    """The Messages request for a chat completion ``body``.

    Raises:
        InvalidRequest: a field the Messages API cannot carry, named in ``param``.
    """
    _refuse_unmapped(body)
    system, messages = _messages(body.get("messages"))
    out: dict[str, Any] = {
        "model": upstream_model,
        "messages": messages,
        "max_tokens": _max_tokens(body),
    }
    if system:
        out["system"] = system
    for key in ("temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    if isinstance(out.get("temperature"), int | float) and out["temperature"] > 1:
        raise InvalidRequest(
            "'temperature' above 1 cannot be sent to an Anthropic backend", param="temperature"
        )
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if body.get("user") is not None:
        out["metadata"] = {"user_id": body["user"]}
    return out | _tools(body)


def response(payload: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for a ``message``.

    Raises:
        ValueError: not the shape of a message.
    """
    try:
        blocks = payload["content"]
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        calls = [_tool_call(b) for b in blocks if b.get("type") == "tool_use"]
        finish = _FINISH.get(payload.get("stop_reason") or "end_turn", "stop")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a message: {exc!r}") from None
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{payload.get('id', '')}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": payload.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(payload.get("usage")),
    }


async def chunks(events: AsyncIterator[tuple[str, str]], include_usage: bool) -> AsyncIterator[str]:
    """The ``data`` of OpenAI chunks for Anthropic's events, ``[DONE]`` last; an ``error`` event
    becomes an ``{"error": ...}`` chunk."""
    stream = _Chunks(include_usage)
    async for name, data in events:
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            body = {
                "type": "error",
                "error": {"message": "the backend sent an event that is not JSON"},
            }
            name = "error"
        for chunk in stream.add(name, body):
            yield json.dumps(chunk, separators=(",", ":"))
        if name in ("error", "message_stop"):
            yield _DONE
            return


class _Chunks:
    """OpenAI chunks as events arrive; each ``tool_use`` block is the next tool call index."""

    def __init__(self, include_usage: bool) -> None:
        self._include_usage = include_usage
        self._id = "chatcmpl-"
        self._model = ""
        self._usage: dict[str, Any] = {}
        self._calls: dict[int, int] = {}  # content block index -> tool call index

    def add(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        if name == "error":
            error = body.get("error") or {}
            return [
                {
                    "error": {
                        "message": str(error.get("message", "")),
                        "code": None,
                        "type": str(error.get("type", "api_error")),
                    }
                }
            ]
        handler = {
            "message_start": self._message_start,
            "message_delta": self._message_delta,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "message_stop": self._message_stop,
        }.get(name)
        return handler(body) if handler is not None else []  # ping, content_block_stop

    def _message_start(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        message = body.get("message") or {}
        self._id, self._model = f"chatcmpl-{message.get('id', '')}", str(message.get("model", ""))
        self._usage = message.get("usage") or {}
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block_start(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        block = body.get("content_block") or {}
        if block.get("type") != "tool_use":
            return []
        index = self._calls[body.get("index", -1)] = len(self._calls)
        call = {
            "index": index,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        delta = body.get("delta") or {}
        if delta.get("type") == "text_delta":
            return [self._chunk({"content": delta.get("text", "")})]
        if delta.get("type") == "input_json_delta" and body.get("index") in self._calls:
            call = {
                "index": self._calls[body["index"]],
                "function": {"arguments": delta.get("partial_json", "")},
            }
            return [self._chunk({"tool_calls": [call]})]
        return []

    def _message_delta(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        self._usage = {
            **self._usage,
            **{k: v for k, v in (body.get("usage") or {}).items() if v is not None},
        }
        reason = (body.get("delta") or {}).get("stop_reason") or "end_turn"
        return [self._chunk({}, _FINISH.get(reason, "stop"))]

    def _message_stop(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        if not self._include_usage:
            return []
        return [{**self._chunk({}), "choices": [], "usage": _usage(self._usage)}]

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._model,
            "choices": [choice],
        }


def _refuse_unmapped(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if value is None or key in _MAPPED:
            continue
        if key in _NEUTRAL and value == _NEUTRAL[key]:
            continue
        raise InvalidRequest(f"'{key}' cannot be sent to an Anthropic backend", param=key)


def _max_tokens(body: dict[str, Any]) -> Any:
    value = body.get("max_completion_tokens")
    value = body.get("max_tokens") if value is None else value
    return DEFAULT_MAX_TOKENS if value is None else value


def _messages(messages: Any) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        _refuse_keys(message, where)
        role = message.get("role")
        if role in ("system", "developer"):
            if out:
                raise InvalidRequest(
                    f"'{where}': an Anthropic backend takes system messages "
                    "only before the conversation",
                    param=f"{where}.role",
                )
            system.append(_text(message.get("content"), f"{where}.content"))
            continue
        role, blocks = _turn(message, where)
        if out and out[-1]["role"] == role:  # tool results and the user's next words: one turn
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _refuse_keys(message: dict[str, Any], where: str) -> None:
    for key, value in message.items():
        if key not in ("role", "content", "tool_calls", "tool_call_id") and value is not None:
            raise InvalidRequest(
                f"'{where}.{key}' cannot be sent to an Anthropic backend", param=f"{where}.{key}"
            )


def _turn(message: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    role, content = message.get("role"), message.get("content")
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(message.get("tool_call_id")),
            "content": _text(content, f"{where}.content"),
        }
        return "user", [result]
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"'{where}.role' {role!r} is not a chat role", param=f"{where}.role")
    text = _text(content, f"{where}.content") if content is not None else ""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if role == "assistant":
        blocks += [
            _tool_use(c, f"{where}.tool_calls[{j}]")
            for j, c in enumerate(message.get("tool_calls") or ())
        ]
    return role, blocks


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of parts", param=where)
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise InvalidRequest(
                f"'{where}[{j}].type': only text parts can be sent to an Anthropic backend",
                param=f"{where}[{j}].type",
            )
    return "".join(str(part.get("text", "")) for part in content)


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    try:
        function = call["function"]
        args = json.loads(function["arguments"])
        if not isinstance(args, dict):
            raise ValueError("not an object")
    except (KeyError, TypeError, ValueError):
        raise InvalidRequest(
            f"'{where}.function.arguments' must be a JSON object",
            param=f"{where}.function.arguments",
        ) from None
    return {
        "type": "tool_use",
        "id": str(call.get("id")),
        "name": str(function.get("name")),
        "input": args,
    }


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if not tools:
        return {}
    out: dict[str, Any] = {"tools": [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]}
    choice = _tool_choice(body.get("tool_choice"))
    if body.get("parallel_tool_calls") is False:
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out | ({"tool_choice": choice} if choice else {})


def _tool(tool: Any, where: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function":
        raise InvalidRequest(
            f"'{where}': only function tools can be sent to an Anthropic backend",
            param=f"{where}.type",
        )
    if function.get("strict"):
        raise InvalidRequest(
            f"'{where}.function.strict' cannot be sent to an Anthropic backend",
            param=f"{where}.function.strict",
        )
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    out = {"name": function.get("name"), "input_schema": schema}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return {"type": "tool", "name": name}
    kinds = {"auto": "auto", "required": "any", "none": "none"}
    if choice not in kinds:
        raise InvalidRequest(
            "'tool_choice' must be 'auto', 'required', 'none' or a function", param="tool_choice"
        )
    return {"type": kinds[choice]}


def _usage(usage: Any) -> dict[str, Any]:
    usage = usage if isinstance(usage, dict) else {}
    cached = _count(usage.get("cache_read_input_tokens"))
    prompt = _count(usage.get("input_tokens")) + cached
    prompt += _count(usage.get("cache_creation_input_tokens"))
    completion = _count(usage.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block.get("input", {}))
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }
