"""Anthropic Messages output: the ``message`` body and the streamed event sequence.

Streaming follows Anthropic's order: ``message_start``, then per content block
``content_block_start``, ``content_block_delta``*, ``content_block_stop`` (a ``ping`` after the
first block starts, and as keepalive), then ``message_delta`` (stop reason, usage) and
``message_stop``. An error after the headers went out is an ``error`` event. Thinking text (split
out by the request's reasoning splitter) streams as ``thinking`` blocks: ``thinking_delta``s,
then one ``signature_delta`` before the block stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from mlxd.errors import MlxdError
from mlxd.gateway.request import EventStream, ParsedRequest
from mlxd.gateway.surfaces.anthropic.thinking import signature
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.sse import KEEPALIVE_S, next_event
from mlxd.gateway.tools.calls import ToolCall, ToolCallParser
from mlxd.gateway.tools.reasoning import Split
from mlxd.protocol.messages import Finished, TokenDelta, Usage

log = logging.getLogger(__name__)

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named SSE event: ``event: name`` and ``data: {"type": name, ...}``."""
    body = json.dumps({"type": name, **data}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {body}\n\n".encode()


def error_body(exc: MlxdError) -> dict[str, Any]:
    """Anthropic's error object for ``exc``."""
    kind = error_type(exc.status_code, exc.code)
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_type(status: int, code: str = "") -> str:
    """Anthropic's error ``type`` for an HTTP status (a full queue is ``overloaded_error``)."""
    if code in ("overloaded", "worker_unavailable"):
        return "overloaded_error"
    types = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        408: "timeout_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
        529: "overloaded_error",
    }
    return types.get(status, "invalid_request_error" if status < 500 else "api_error")


def usage_body(usage: Usage) -> dict[str, int]:
    """Anthropic ``usage``: ``input_tokens`` excludes the prompt tokens read from cache."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(finish_reason: str, stop: str | None, has_calls: bool) -> str:
    """Anthropic's ``stop_reason`` for how a choice ended."""
    if finish_reason == "length":
        return "max_tokens"
    if has_calls:
        return "tool_use"
    return "stop_sequence" if stop is not None else "end_turn"


def message_body(
    message_id: str,
    model: str,
    result: ChoiceResult,
    usage: Usage,
    echo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A non-streamed ``message`` object; ``echo``: fields reporting how the request was read
    (``context_management``)."""
    content: list[dict[str, Any]] = []
    if result.reasoning:
        content.append(_thinking_block(result.reasoning))
    if result.text:
        content.append({"type": "text", "text": result.text})
    content += [_tool_use(call) for call in result.tool_calls]
    reason = stop_reason(result.finish_reason, result.stop, bool(result.tool_calls))
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": result.stop if reason == "stop_sequence" else None,
        "usage": usage_body(usage),
        **(echo or {}),
    }


async def message_events(
    stream: EventStream,
    first: TokenDelta | Finished,
    parsed: ParsedRequest,
    message_id: str,
    deadline: float,
) -> AsyncGenerator[bytes, None]:
    """The SSE events of one streamed message; the request is cancelled on any exit."""
    blocks = _Blocks(parsed)
    try:
        # The prompt's usage comes with the first event; message_delta carries the totals.
        prompt = first.prompt if isinstance(first, TokenDelta) else first.usage
        prompt = prompt or Usage(prompt_tokens=0, completion_tokens=0)
        start: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": parsed.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_body(
                Usage(
                    prompt_tokens=prompt.prompt_tokens,
                    completion_tokens=0,
                    cached_tokens=prompt.cached_tokens,
                )
            ),
        }
        yield event("message_start", {"message": start})
        item: TokenDelta | Finished | None = first
        while not isinstance(item, Finished):
            for frame in [PING] if item is None else blocks.add(item):
                yield frame
            item = await next_event(stream, deadline, KEEPALIVE_S)
        for frame in blocks.finish(item.text):
            yield frame
        reason = stop_reason(item.finish_reason, item.stop, blocks.num_calls > 0)
        delta = {
            "stop_reason": reason,
            "stop_sequence": item.stop if reason == "stop_sequence" else None,
        }
        usage = usage_body(stream.usage)
        yield event("message_delta", {"delta": delta, "usage": usage, **parsed.echo})
        yield event("message_stop", {})
    except MlxdError as exc:
        log.warning("request %s failed mid-stream: %s", stream.request_id, exc.message)
        yield f"event: error\ndata: {json.dumps(error_body(exc))}\n\n".encode()
    finally:
        with anyio.CancelScope(shield=True):
            await stream.cancel()


class _Blocks:
    """Content blocks as they stream: a thinking block opens on thinking text, a text block on
    answer text, and each tool call is a block."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parser = parsed.new_tool_parser() or ToolCallParser()
        self._parse = parsed.parse_tools
        self._splitter = parsed.new_reasoning_splitter()
        self._index = -1  # of the last block started
        self._open_kind: str | None = None  # "thinking", "text" or "tool_use" while one is open
        self._thought: list[str] = []  # the open thinking block's text, for its signature
        self.num_calls = 0

    def add(self, delta: TokenDelta) -> list[bytes]:
        split = self._splitter.delta(delta) if self._splitter else Split(answer=delta.text)
        return self._split(split)

    def finish(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        if self._splitter is not None:
            frames += self._split(self._splitter.feed(text)) + self._split(self._splitter.finish())
        elif text:
            frames += self._answer(text)
        if self._parse:
            content, calls = self._parser.finish()
            frames += self._text(content) + self._calls(calls)
        return frames + self._close()

    def _split(self, split: Split) -> list[bytes]:
        return self._thinking(split.reasoning) + self._answer(split.answer)

    def _answer(self, text: str) -> list[bytes]:
        if not self._parse:
            return self._text(text)
        content, calls = self._parser.feed(text)
        return self._text(content) + self._calls(calls)

    def _thinking(self, text: str) -> list[bytes]:
        if not text:
            return []
        frames = []
        if self._open_kind != "thinking":
            frames = self._close() + self._open(
                {"type": "thinking", "thinking": "", "signature": ""}
            )
        self._thought.append(text)
        delta = {"type": "thinking_delta", "thinking": text}
        return [*frames, event("content_block_delta", {"index": self._index, "delta": delta})]

    def _text(self, text: str) -> list[bytes]:
        if not text:
            return []
        frames = []
        if self._open_kind != "text":
            frames = self._close() + self._open({"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [*frames, event("content_block_delta", {"index": self._index, "delta": delta})]

    def _calls(self, calls: list[ToolCall]) -> list[bytes]:
        frames: list[bytes] = []
        for call in calls:
            frames += self._close()
            frames += self._open({**_tool_use(call), "input": {}})
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            frames.append(event("content_block_delta", {"index": self._index, "delta": delta}))
            frames += self._close()
            self.num_calls += 1
        return frames

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        self._index += 1
        self._open_kind = block["type"]
        frames = [event("content_block_start", {"index": self._index, "content_block": block})]
        return frames + [PING] if self._index == 0 else frames

    def _close(self) -> list[bytes]:
        if self._open_kind is None:
            return []
        frames = []
        if self._open_kind == "thinking":
            delta = {"type": "signature_delta", "signature": signature("".join(self._thought))}
            frames.append(event("content_block_delta", {"index": self._index, "delta": delta}))
            self._thought = []
        self._open_kind = None
        return [*frames, event("content_block_stop", {"index": self._index})]


def _thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature(text)}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{call.id.removeprefix('call_')}",
        "name": call.name,
        "input": json.loads(call.arguments),
    }
