"""NDJSON streaming: one JSON object per line (``application/x-ndjson``), Ollama's stream.

A line per batch of text (events already waiting go out together), a line per tool call, then
the last line with ``done: true`` and the durations. With ``think`` sent, thinking text goes in
its own field (``message.thinking``, or ``thinking`` on generate), split by the reasoning
splitter before tool calls are looked for in the answer. An error after the headers went out is
an ``{"error": "..."}`` line, as Ollama writes it. Whatever ends the stream cancels the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import anyio

from mlxd.errors import MlxdError
from mlxd.gateway.request import Opened
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.ollama.body import Shape, last, line
from mlxd.gateway.surfaces.ollama.timing import durations
from mlxd.gateway.surfaces.sse import next_event
from mlxd.gateway.tools.calls import ToolCall, ToolCallParser
from mlxd.gateway.tools.reasoning import ReasoningSplitter, Split
from mlxd.protocol.messages import Finished, TokenDelta

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/x-ndjson"


class _Lines:
    """One answer's lines: its shape, model name, tool parser and reasoning splitter."""

    def __init__(self, opened: Opened, shape: Shape, model: str) -> None:
        self.opened = opened
        self.shape = shape
        self.model = model
        self.parser: ToolCallParser | None = opened.parsed.new_tool_parser()
        self.splitter: ReasoningSplitter | None = opened.parsed.new_reasoning_splitter()

    def add(self, events: list[TokenDelta | Finished]) -> bytes:
        """The line for new events (none when they hold nothing to show)."""
        splits = [self._split(e) for e in events]
        return self._part("".join(s.reasoning for s in splits), "".join(s.answer for s in splits))

    def end(self, finished: Finished) -> bytes:
        """The rest of the text, then the last line."""
        rest = self.splitter.finish() if self.splitter is not None else Split()
        head = self._part(rest.reasoning, rest.answer)
        result = ChoiceResult(finish_reason=finished.finish_reason)
        if self.parser is not None:
            result.text, result.tool_calls = self.parser.finish()
        fields = durations(self.opened.record, self.opened.stream.usage)
        return head + line(last(self.shape, self.model, result, fields))

    def _split(self, event: TokenDelta | Finished) -> Split:
        if self.splitter is None:
            return Split(answer=event.text)
        if isinstance(event, TokenDelta):
            return self.splitter.delta(event)
        return self.splitter.feed(event.text)

    def _part(self, thinking: str, text: str) -> bytes:
        calls: list[ToolCall] = []
        if self.parser is not None:
            text, calls = self.parser.feed(text)
        if not text and not calls and not thinking:
            return b""
        return line(self.shape.part(self.model, text, calls, thinking))


async def ndjson_lines(
    opened: Opened, first: TokenDelta | Finished, shape: Shape, model: str
) -> AsyncGenerator[bytes, None]:
    """The stream's lines from its already received ``first`` event on."""
    stream, lines = opened.stream, _Lines(opened, shape, model)
    try:
        event: TokenDelta | Finished = first
        while True:
            events = [event]
            while not isinstance(event, Finished) and (ready := stream.next_ready()) is not None:
                event = ready
                events.append(event)
            if out := lines.add(events):
                yield out
            if isinstance(event, Finished):
                yield lines.end(event)
                return
            found = await next_event(stream, opened.deadline)
            assert found is not None  # no keepalive was asked for
            event = found
    except MlxdError as exc:
        log.warning("request %s failed mid-stream: %s", stream.request_id, exc.message)
        yield line({"error": exc.message})
    finally:
        with anyio.CancelScope(shield=True):
            await stream.cancel()
