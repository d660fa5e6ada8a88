"""Tool calls in model output, split from the content as it streams.

The markers and the parse function come from the model's ``ToolFormat`` (``formats``):
Hermes / Qwen ``<tool_call>{json}</tool_call>`` by default, or one of mlx-lm's parsers. A call
that does not parse (the model stopped mid-call, or wrote bad JSON) is handed back as ordinary
content: output is never dropped.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from mlxd.gateway.tools.formats import JSON_TOOLS, ToolFormat

TOOL_CALL_START = JSON_TOOLS.start
TOOL_CALL_END = JSON_TOOLS.end


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: ``arguments`` is a JSON document as a string, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI ``tool_calls[]`` entry (with ``index`` in streamed deltas)."""
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def parse_calls(
    body: str, fmt: ToolFormat = JSON_TOOLS, tools: list[dict[str, Any]] | None = None
) -> list[ToolCall] | None:
    """The calls in the text between the markers, or ``None`` if it does not parse."""
    try:
        data = fmt.parse(body, tools)
    except (ValueError, SyntaxError, TypeError, KeyError, IndexError, AttributeError):
        return None  # mlx-lm's parsers raise these on text that is not a call
    items = data if isinstance(data, list) else [data]
    calls = [_call(item, fmt.keeps_ids) for item in items]
    return None if not calls or None in calls else calls  # type: ignore[return-value]


def _call(data: Any, keeps_id: bool = False) -> ToolCall | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
    else:
        args = json.dumps(args, ensure_ascii=False)
    given = data.get("id") if keeps_id else None
    call_id = given if isinstance(given, str) and given else new_call_id()
    return ToolCall(id=call_id, name=data["name"], arguments=args)


def new_call_id() -> str:
    """A fresh tool call id, OpenAI style."""
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    """Splits streamed text into content and tool calls.

    ``feed`` returns the content that is certainly not part of a call (it holds back a possible
    start marker) and the calls completed so far; ``finish`` flushes the rest.

    Args:
        max_calls: calls beyond this many are dropped (``parallel_tool_calls: false``).
        forced: the whole output is one call's JSON body, without markers (``tool_choice``
            "required" or a named function, enforced by constrained decoding).
        fmt: the model's tool-call format.
        tools: the request's tools (some of mlx-lm's parsers type arguments by them).
    """

    def __init__(
        self,
        max_calls: int | None = None,
        forced: bool = False,
        fmt: ToolFormat = JSON_TOOLS,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.max_calls = max_calls
        self.forced = forced
        self.fmt = JSON_TOOLS if forced else fmt
        self.tools = tools
        self._buffer = ""
        self._in_call = forced
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Add streamed text; return the releasable content and the completed calls."""
        self._buffer += text
        content: list[str] = []
        calls: list[ToolCall] = []
        start, end = self.fmt.start, self.fmt.end
        while True:
            if self._in_call:
                cut = self._buffer.find(end) if end else -1  # no end marker: runs to the end
                if cut < 0:
                    break
                self._close_call(self._buffer[:cut], content, calls)
                self._buffer = self._buffer[cut + len(end) :]
                continue
            cut = self._buffer.find(start)
            if cut < 0:
                keep = _partial_suffix(self._buffer, start)
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            content.append(self._buffer[:cut])
            self._buffer = self._buffer[cut + len(start) :]
            self._in_call = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The output ended: an unterminated call is parsed if it is complete."""
        content: list[str] = []
        calls: list[ToolCall] = []
        if self._in_call:
            self._close_call(self._buffer, content, calls, terminated=False)
        else:
            content.append(self._buffer)
        self._buffer = ""
        return "".join(content), calls

    def _close_call(
        self, body: str, content: list[str], calls: list[ToolCall], terminated: bool = True
    ) -> None:
        self._in_call = False
        parsed = parse_calls(body, self.fmt, self.tools)
        if parsed is None and self.forced:
            content.append(body)
        elif parsed is None:
            end = self.fmt.end if terminated else ""
            content.append(f"{self.fmt.start}{body}{end}")
        for call in parsed or []:
            if self.max_calls is None or self.num_calls < self.max_calls:
                calls.append(call)
                self.num_calls += 1


def split_tool_calls(text: str, parser: ToolCallParser) -> tuple[str, list[ToolCall]]:
    """The content and the tool calls of a whole output, split by a fresh ``parser``."""
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    return content + rest, calls + more


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
