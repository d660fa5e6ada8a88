"""NDJSON streaming: one JSON object per line (``application/x-ndjson``), Ollama's stream.

A line per batch of text (events already waiting go out together), a line per tool call, then
the last line with ``done: true`` and the durations. An error after the headers went out is a
``{"error": "..."}`` line, as Ollama writes it. Whatever ends the stream cancels the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import anyio

from mlxd.errors import MlxdError
from mlxd.gateway.request import Opened
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.ollama.body import Shape, last, line
from mlxd.gateway.surfaces.ollama.timing import timing_of
from mlxd.gateway.surfaces.sse import next_event
from mlxd.gateway.tools.calls import ToolCall, ToolCallParser
from mlxd.protocol.messages import Finished, TokenDelta

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/x-ndjson"


async def ndjson_lines(
    opened: Opened, first: TokenDelta | Finished, shape: Shape, model: str
) -> AsyncGenerator[bytes, None]:
    """The stream's lines from its already received ``first`` event on."""
    stream, parser = opened.stream, opened.parsed.new_tool_parser()
    try:
        event: TokenDelta | Finished = first
        while True:
            events = [event]
            while not isinstance(event, Finished) and (ready := stream.next_ready()) is not None:
                event = ready
                events.append(event)
            text = "".join(e.text for e in events)
            if isinstance(event, Finished):
                yield _end(opened, shape, model, parser, text, event)
                return
            if out := _part(shape, model, parser, text):
                yield out
            found = await next_event(stream, opened.deadline)
            assert found is not None  # no keepalive was asked for
            event = found
    except MlxdError as exc:
        log.warning("request %s failed mid-stream: %s", stream.request_id, exc.message)
        yield line({"error": exc.message})
    finally:
        with anyio.CancelScope(shield=True):
            await stream.cancel()


def _part(shape: Shape, model: str, parser: ToolCallParser | None, text: str) -> bytes:
    calls: list[ToolCall] = []
    if parser is not None:
        text, calls = parser.feed(text)
    if not text and not calls:
        return b""
    return line(shape.part(model, text, calls))


def _end(
    opened: Opened,
    shape: Shape,
    model: str,
    parser: ToolCallParser | None,
    text: str,
    finished: Finished,
) -> bytes:
    head = _part(shape, model, parser, text)
    result = ChoiceResult(finish_reason=finished.finish_reason)
    if parser is not None:
        result.text, result.tool_calls = parser.finish()
    fields = timing_of(opened.stream).fields(opened.stream.usage)
    return head + line(last(shape, model, result, fields))
