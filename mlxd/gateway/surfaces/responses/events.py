"""Responses streaming: the typed SSE events of one response, in the order the OpenAI SDK parses.

``response.created`` and ``response.in_progress``; then per output item
``response.output_item.added``, its content (the model's thinking, a reasoning item:
``response.content_part.added``, ``response.reasoning_text.delta``*,
``response.reasoning_text.done``, ``response.content_part.done``; a message:
``response.content_part.added``,
``response.output_text.delta``*, ``response.output_text.done``, ``response.content_part.done``;
a function call: ``response.function_call_arguments.delta`` and ``.done``; a custom tool call:
``response.custom_tool_call_input.delta`` and ``.done``) and ``response.output_item.done``;
last ``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it). An
error after the headers went out is an ``error`` event and ``response.failed``. Every event
carries its ``sequence_number``; silence is filled with SSE comments.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from mlxd.errors import MlxdError
from mlxd.gateway.request import EventStream
from mlxd.gateway.surfaces.responses.body import (
    ResponseShell,
    call_item,
    call_item_id,
    custom_input,
    message_item,
    reasoning_item,
    reasoning_part,
    text_part,
)
from mlxd.gateway.surfaces.responses.items import new_item_id
from mlxd.gateway.surfaces.responses.schemas import ResponsesRequest
from mlxd.gateway.surfaces.sse import KEEPALIVE, KEEPALIVE_S, next_event
from mlxd.gateway.tools.calls import ToolCall
from mlxd.gateway.tools.reasoning import Split
from mlxd.protocol.messages import Finished, TokenDelta

log = logging.getLogger(__name__)


class Sequence:
    """Numbers a response's events: each is ``event: type`` and its JSON with
    ``sequence_number``."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.number, **data}
        self.number += 1
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {text}\n\n".encode()


async def response_events(
    stream: EventStream, first: TokenDelta | Finished, shell: ResponseShell, deadline: float
) -> AsyncGenerator[bytes, None]:
    """The SSE events of one streamed response; the request is cancelled on any exit."""
    event = Sequence()
    output = Output(shell.parsed, event)
    try:
        yield event("response.created", response=shell.object("in_progress", []))
        yield event("response.in_progress", response=shell.object("in_progress", []))
        item: TokenDelta | Finished | None = first
        while not isinstance(item, Finished):
            frames = [KEEPALIVE] if item is None else output.add(item)
            if frames:
                yield b"".join(frames)
            item = await next_event(stream, deadline, KEEPALIVE_S)
        frames = output.finish(item.text)
        final = shell.finish(output.items, stream.usage, item.finish_reason, output.tokens)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield b"".join([*frames, event(kind, response=final)])
    except MlxdError as exc:
        log.warning("request %s failed mid-stream: %s", stream.request_id, exc.message)
        error = {"code": exc.code, "message": exc.message}
        failed = shell.object("failed", output.items, error=error)
        yield event("error", **error, param=exc.param) + event("response.failed", response=failed)
    finally:
        with anyio.CancelScope(shield=True):
            await stream.cancel()


class Output:
    """A response's output items as they stream: a reasoning item opens on thinking text (split
    out first, so a tool call written while thinking is not a call), a message on answer text
    that is not blank (blank text beside tool calls is dropped, as in a whole answer), and each
    tool call is an item.

    Args:
        parsed: the request (its tool parser, its custom tools).
        event: the response's event numbering.
    """

    def __init__(self, parsed: ResponsesRequest, event: Sequence) -> None:
        self._parser = parsed.new_tool_parser()
        self._splitter = parsed.new_reasoning_splitter()
        self._reasoning: dict[str, Any] | None = None  # the open reasoning item
        self._thought: list[str] = []  # its text so far
        self._custom = parsed.spec.custom_tools
        self._event = event
        self.items: list[dict[str, Any]] = []  # finished, in output order
        self._message: dict[str, Any] | None = None  # the open message item
        self._text: list[str] = []  # its text so far
        self._blank = ""  # blank text not yet shown
        self._num_calls = 0

    @property
    def tokens(self) -> int:
        """The output tokens inside thinking so far (``reasoning_tokens``)."""
        return 0 if self._splitter is None else self._splitter.tokens

    def add(self, delta: TokenDelta) -> list[bytes]:
        """The events of a new delta of the output."""
        if self._splitter is None:
            return self._answer(delta.text)
        return self._split(self._splitter.delta(delta))

    def finish(self, text: str) -> list[bytes]:
        """The events of the output's last text, closing every open item."""
        if self._splitter is None:
            frames = self._answer(text)
        else:
            frames = self._split(self._splitter.feed(text)) + self._split(self._splitter.finish())
        frames += self._close_reasoning()
        if self._parser is not None:
            content, calls = self._parser.finish()
            frames += self._add_text(content) + self._add_calls(calls)
        answered = any(item["type"] != "reasoning" for item in self.items)
        if not answered and self._message is None:  # nothing but blank text (or nothing)
            frames += self._open_message()
            frames += self._delta(self._blank) if self._blank else []
        return frames + self._close_message()

    # Internal helpers

    def _split(self, split: Split) -> list[bytes]:
        return self._think(split.reasoning) + self._answer(split.answer)

    def _answer(self, text: str) -> list[bytes]:
        """Answer text: it ends the thinking before it; tool calls are looked for in it only."""
        if not text:
            return []
        frames = self._close_reasoning()
        if self._parser is None:
            return frames + self._add_text(text)
        content, calls = self._parser.feed(text)
        return frames + self._add_text(content) + self._add_calls(calls)

    def _think(self, text: str) -> list[bytes]:
        if not text:
            return []
        frames: list[bytes] = []
        where = {"output_index": len(self.items), "content_index": 0}
        if self._reasoning is None:
            self._reasoning = reasoning_item(new_item_id("reasoning"), None, "in_progress")
            self._thought = []
            added = self._event(
                "response.output_item.added", output_index=len(self.items), item=self._reasoning
            )
            part = reasoning_part("")
            item_id = self._reasoning["id"]
            opened = self._event("response.content_part.added", item_id=item_id, **where, part=part)
            frames = [added, opened]
        self._thought.append(text)
        item_id = self._reasoning["id"]
        delta = self._event("response.reasoning_text.delta", item_id=item_id, **where, delta=text)
        return [*frames, delta]

    def _close_reasoning(self) -> list[bytes]:
        if self._reasoning is None:
            return []
        text = "".join(self._thought)
        item = reasoning_item(self._reasoning["id"], text)
        where = {"item_id": item["id"], "output_index": len(self.items), "content_index": 0}
        frames = [
            self._event("response.reasoning_text.done", **where, text=text),
            self._event("response.content_part.done", **where, part=reasoning_part(text)),
            self._event("response.output_item.done", output_index=len(self.items), item=item),
        ]
        self.items.append(item)
        self._reasoning = None
        return frames

    def _add_text(self, text: str) -> list[bytes]:
        if self._message is None and not (self._blank + text).strip():
            self._blank += text
            return []
        frames = self._open_message() if self._message is None else []
        text, self._blank = self._blank + text, ""
        return frames + self._delta(text)

    def _open_message(self) -> list[bytes]:
        self._message = message_item(new_item_id("message"), None, "in_progress")
        self._text = []
        where = {"item_id": self._message["id"], "output_index": len(self.items)}
        return [
            self._event(
                "response.output_item.added", output_index=len(self.items), item=self._message
            ),
            self._event(
                "response.content_part.added", **where, content_index=0, part=text_part("")
            ),
        ]

    def _delta(self, text: str) -> list[bytes]:
        assert self._message is not None
        self._text.append(text)
        where = {"item_id": self._message["id"], "output_index": len(self.items)}
        delta = self._event(
            "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
        )
        return [delta]

    def _close_message(self) -> list[bytes]:
        if self._message is None:
            return []
        text = "".join(self._text)
        item = message_item(self._message["id"], text)
        where = {"item_id": item["id"], "output_index": len(self.items), "content_index": 0}
        frames = [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=text_part(text)),
            self._event("response.output_item.done", output_index=len(self.items), item=item),
        ]
        self.items.append(item)
        self._message = None
        return frames

    def _add_calls(self, calls: list[ToolCall]) -> list[bytes]:
        frames: list[bytes] = []
        for call in calls:
            frames += self._close_message()
            frames += self._call(call)
            self._num_calls += 1
        if calls:
            self._blank = ""  # blank text beside calls is not an answer
        return frames

    def _call(self, call: ToolCall) -> list[bytes]:
        item_id, index = call_item_id(call, self._custom), len(self.items)
        started = call_item(item_id, call, self._custom, done=False)
        item = call_item(item_id, call, self._custom)
        where = {"item_id": item_id, "output_index": index}
        if item["type"] == "custom_tool_call":
            text = custom_input(call.arguments)
            content = [
                self._event("response.custom_tool_call_input.delta", **where, delta=text),
                self._event("response.custom_tool_call_input.done", **where, input=text),
            ]
        else:
            args = call.arguments
            content = [
                self._event("response.function_call_arguments.delta", **where, delta=args),
                self._event(
                    "response.function_call_arguments.done", **where, name=call.name, arguments=args
                ),
            ]
        self.items.append(item)
        return [
            self._event("response.output_item.added", output_index=index, item=started),
            *content,
            self._event("response.output_item.done", output_index=index, item=item),
        ]
