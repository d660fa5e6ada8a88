"""Tool calls in model output: the Hermes / Qwen ``<tool_call>{json}</tool_call>`` format.

This is the format of mlx-lm's ``json_tools`` parser (chosen by mlx-lm for chat templates that
wrap ``tool_call.name`` in ``<tool_call>`` tags: Qwen 2.5/3, Hermes, our made models). mlx-lm's
parser modules import the ``mlx_lm`` package (and with it MLX), which the gateway never loads, so
the same few lines live here, with a streaming splitter around them.

A call that does not parse (the model stopped mid-call, or wrote bad JSON) is handed back as
ordinary content: output is never dropped.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


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


def parse_call(body: str) -> ToolCall | None:
    """The call in the text between the tags, or ``None`` if it is not ``{"name", "arguments"}``."""
    try:
        data = json.loads(body.strip())
    except ValueError:
        return None
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
    return ToolCall(id=new_call_id(), name=data["name"], arguments=args)


def new_call_id() -> str:
    """A fresh tool call id, OpenAI style."""
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    """Splits streamed text into content and tool calls.

    ``feed`` returns the content that is certainly not part of a call (it holds back a possible
    start of ``<tool_call>``) and the calls completed so far; ``finish`` flushes the rest.

    Args:
        max_calls: calls beyond this many are dropped (``parallel_tool_calls: false``).
        forced: the whole output is one call's JSON body, without tags (``tool_choice``
            "required" or a named function, enforced by constrained decoding).
    """

    def __init__(self, max_calls: int | None = None, forced: bool = False) -> None:
        self.max_calls = max_calls
        self.forced = forced
        self._buffer = ""
        self._in_call = forced
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Add streamed text; return the releasable content and the completed calls."""
        self._buffer += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_call:
                end = self._buffer.find(TOOL_CALL_END)
                if end < 0:
                    break
                self._close_call(self._buffer[:end], content, calls)
                self._buffer = self._buffer[end + len(TOOL_CALL_END) :]
                continue
            start = self._buffer.find(TOOL_CALL_START)
            if start < 0:
                keep = _partial_suffix(self._buffer, TOOL_CALL_START)
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            content.append(self._buffer[:start])
            self._buffer = self._buffer[start + len(TOOL_CALL_START) :]
            self._in_call = True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The output ended: an unterminated call is parsed if it is complete JSON."""
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
        call = parse_call(body)
        if call is None and self.forced:
            content.append(body)
        elif call is None:
            end = TOOL_CALL_END if terminated else ""
            content.append(f"{TOOL_CALL_START}{body}{end}")
        elif self.max_calls is None or self.num_calls < self.max_calls:
            calls.append(call)
            self.num_calls += 1


def split_tool_calls(
    text: str, max_calls: int | None = None, forced: bool = False
) -> tuple[str, list[ToolCall]]:
    """The content and the tool calls of a whole output (see ``ToolCallParser``)."""
    parser = ToolCallParser(max_calls, forced)
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    return content + rest, calls + more


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
