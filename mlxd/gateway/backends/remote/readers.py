"""A remote backend's answer read as the internal event stream: one reader per backend kind,
for its streamed events and its whole (non-streamed) body.

Each choice's text becomes ``TokenDelta`` events and its end one ``Finished`` (usage, the
finish reason as the local backend says it: ``stop``, ``length``, ``content_filter``). The
upstream's structured tool calls become event text in the gateway's own tool format
(``tools.formats.UPSTREAM_TOOLS``, ids kept), which the request's tool parser splits out as
it does a local model's calls. Upstream reasoning (Anthropic ``thinking`` blocks, OpenAI-style
``reasoning_content`` / ``reasoning``) goes the same way when the surface splits reasoning
(``ParsedRequest.reasoning``): between the gateway's own thinking markers (``UPSTREAM_THINKING``,
named on each choice's first delta as a thinking model's worker names its own), which the
surface's ``ReasoningSplitter`` cuts out; otherwise it is not passed on. Readers are plain
objects (no I/O): ``source`` feeds them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd.errors import UpstreamError
from mlxd.gateway.tools.formats import upstream_call_text
from mlxd.protocol.messages import Finished, Thinking, TokenDelta, Usage

Event = TokenDelta | Finished
_TOKEN = secrets.token_hex(8)  # no upstream text can hold the markers
UPSTREAM_THINKING = Thinking(
    start=f"\x1emlxd-think-{_TOKEN}\x1e", end=f"\x1e/mlxd-think-{_TOKEN}\x1e"
)
_OPENAI_FINISH = {"length": "length", "content_filter": "content_filter"}  # others: stop
_ANTHROPIC_FINISH = {"max_tokens": "length", "refusal": "content_filter"}  # others: stop


@dataclass(slots=True)
class _Call:
    """A tool call as it streams in."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def text(self, backend: str) -> str:
        args = "".join(self.arguments).strip() or "{}"
        try:
            json.loads(args)
        except ValueError:
            raise UpstreamError(
                f"backend {backend!r} sent a tool call whose arguments are not JSON"
            ) from None
        return upstream_call_text(self.id, self.name, args)


class _Reader:
    """What both readers share: the choices' request ids, the events they build, and whether
    each choice is in its reasoning (``reasoning``: pass it on, marked)."""

    def __init__(
        self,
        request_id: str,
        n: int,
        backend: str,
        redact: Callable[[str], str],
        reasoning: bool = False,
    ):
        self.backend = backend
        self._ids = [request_id] if n == 1 else [f"{request_id}-{i}" for i in range(n)]
        self._redact = redact
        self._reasoning = reasoning
        self._started = [False] * n  # the choice's first delta went out
        self._thinking = [False] * n  # the choice's reasoning is open

    def _delta(self, index: int, text: str, prompt: Usage | None = None) -> TokenDelta:
        marks = UPSTREAM_THINKING if self._reasoning and not self._started[index] else None
        self._started[index] = True
        if self._thinking[index]:  # the answer (or a call) ends the reasoning before it
            self._thinking[index] = False
            text = UPSTREAM_THINKING.end + text
        return TokenDelta(
            request_id=self._id(index), text=text, token_ids=[], prompt=prompt, thinking=marks
        )

    def _reason(self, index: int, text: Any, prompt: Usage | None = None) -> list[Event]:
        if not self._reasoning or not isinstance(text, str) or not text:
            return []
        opening = "" if self._thinking[index] else UPSTREAM_THINKING.start
        self._thinking[index] = False  # more reasoning: _delta must not close it
        delta = self._delta(index, opening + text, prompt)
        self._thinking[index] = True
        return [delta]

    def _finished(self, index: int, reason: str, usage: Usage, stop: str | None) -> Finished:
        return Finished(request_id=self._id(index), finish_reason=reason, usage=usage, stop=stop)

    def _id(self, index: int) -> str:
        if not 0 <= index < len(self._ids):
            raise UpstreamError(f"backend {self.backend!r} sent a choice index out of range")
        return self._ids[index]

    def _failed(self, error: Any) -> UpstreamError:
        message = error.get("message", "") if isinstance(error, dict) else error
        return UpstreamError(
            f"backend {self.backend!r} failed mid-answer: {self._redact(str(message))}"
        )

    def _unfinished(self) -> UpstreamError:
        return UpstreamError(f"backend {self.backend!r} ended its stream unfinished")


class OpenAIReader(_Reader):
    """Reads ``chat.completion`` (and ``text_completion``) chunks and bodies.

    A choice's tool calls go out when its ``finish_reason`` comes; every ``Finished`` waits
    for the end of the stream, since the usage (``stream_options.include_usage``) comes last.
    """

    def __init__(
        self,
        request_id: str,
        n: int,
        backend: str,
        redact: Callable[[str], str],
        reasoning: bool = False,
    ):
        super().__init__(request_id, n, backend, redact, reasoning)
        self._calls: list[dict[int, _Call]] = [{} for _ in range(n)]
        self._reasons: list[str | None] = [None] * n
        self._usage = Usage(prompt_tokens=0, completion_tokens=0)

    def chunk(self, chunk: Any) -> list[Event]:
        """The events of one streamed chunk."""
        if not isinstance(chunk, dict):
            raise UpstreamError(f"backend {self.backend!r} sent an event that is not an object")
        if chunk.get("error"):
            raise self._failed(chunk["error"])
        if isinstance(chunk.get("usage"), dict):
            self._usage = openai_usage(chunk["usage"])
        out: list[Event] = []
        for choice in chunk.get("choices") or ():
            out += self._choice(choice)
        return out

    def end(self) -> list[Event]:
        """The stream ended (``[DONE]``): every choice's ``Finished``, with the usage."""
        if None in self._reasons:
            raise self._unfinished()
        return [self._finish(i, str(reason)) for i, reason in enumerate(self._reasons)]

    def whole(self, body: Any) -> list[Event]:
        """The events of a non-streamed ``chat.completion`` or ``text_completion``."""
        try:
            choices = [
                {
                    **c,
                    "delta": c.get("message") or {},
                    "finish_reason": c.get("finish_reason") or "stop",
                }
                for c in body["choices"]
            ]
            out = self.chunk({"choices": choices, "usage": body.get("usage")})
        except (KeyError, TypeError, AttributeError):
            raise UpstreamError(f"backend {self.backend!r} answered with bad JSON") from None
        return out + self.end()

    def _choice(self, choice: dict[str, Any]) -> list[Event]:
        index = choice.get("index", 0)
        self._id(index)
        delta = choice.get("delta") or {}
        out = self._reason(index, delta.get("reasoning_content") or delta.get("reasoning"))
        text = delta.get("content") or choice.get("text")
        out += [self._delta(index, text)] if isinstance(text, str) and text else []
        for call in delta.get("tool_calls") or ():
            self._add_call(index, call)
        if choice.get("finish_reason"):
            self._reasons[index] = _OPENAI_FINISH.get(choice["finish_reason"], "stop")
            calls = self._calls[index].values()
            out += [self._delta(index, c.text(self.backend)) for c in calls]
            self._calls[index] = {}
        return out

    def _add_call(self, index: int, delta: dict[str, Any]) -> None:
        calls = self._calls[index]
        call = calls.setdefault(delta.get("index", len(calls)), _Call())
        function = delta.get("function") or {}
        call.id = call.id or str(delta.get("id") or "")
        call.name = call.name or str(function.get("name") or "")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)

    def _finish(self, index: int, reason: str) -> Finished:
        # The request's usage on its first choice: the stream's usage sums its choices'.
        usage = self._usage if index == 0 else _no_completion(self._usage)
        return self._finished(index, reason, usage, None)


class AnthropicReader(_Reader):
    """Reads the Messages API's stream events and ``message`` bodies (one choice).

    The prompt's usage (``message_start``) goes with the first ``TokenDelta``, as a local
    worker's does; each ``tool_use`` block goes out when it stops.
    """

    def __init__(
        self, request_id: str, backend: str, redact: Callable[[str], str], reasoning: bool = False
    ):
        super().__init__(request_id, 1, backend, redact, reasoning)
        self._usage: dict[str, Any] = {}
        self._call: _Call | None = None
        self._sent_prompt = False
        self._stop_reason: str | None = None
        self._stop: str | None = None
        self.finished = False

    def event(self, name: str, body: Any) -> list[Event]:
        """The events of one streamed event (``name``: its SSE event name)."""
        if not isinstance(body, dict):
            raise UpstreamError(f"backend {self.backend!r} sent an event that is not an object")
        kind = body.get("type", name)
        if kind == "error":
            raise self._failed(body.get("error"))
        handler = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
        }.get(kind)
        return handler(body) if handler is not None else []  # ping, and what comes later

    def end(self) -> list[Event]:
        """The stream ended: it must have said ``message_stop``."""
        if not self.finished:
            raise self._unfinished()
        return []

    def whole(self, body: Any) -> list[Event]:
        """The events of a non-streamed ``message``."""
        try:
            out = self._message_start({"message": body})
            for block in body["content"]:
                out += self._block_start({"content_block": block})
                out += self._block_stop({})
            delta = {
                "stop_reason": body.get("stop_reason"),
                "stop_sequence": body.get("stop_sequence"),
            }
            out += self._message_delta({"delta": delta})
        except (KeyError, TypeError, AttributeError):
            raise UpstreamError(f"backend {self.backend!r} answered with bad JSON") from None
        return out + self._message_stop({})

    def _message_start(self, body: dict[str, Any]) -> list[Event]:
        self._merge_usage((body.get("message") or {}).get("usage"))
        return []

    def _block_start(self, body: dict[str, Any]) -> list[Event]:
        block = body.get("content_block") or {}
        if block.get("type") == "tool_use":
            given = block.get("input")
            arguments = [json.dumps(given, ensure_ascii=False)] if given else []
            self._call = _Call(str(block.get("id") or ""), str(block.get("name") or ""), arguments)
            return []
        if block.get("type") == "thinking":
            return self._think(block.get("thinking"))
        return self._text(block.get("text")) if block.get("type") == "text" else []

    def _block_delta(self, body: dict[str, Any]) -> list[Event]:
        delta = body.get("delta") or {}
        if delta.get("type") == "text_delta":
            return self._text(delta.get("text"))
        if delta.get("type") == "thinking_delta":
            return self._think(delta.get("thinking"))
        if delta.get("type") == "input_json_delta" and self._call is not None:
            self._call.arguments.append(str(delta.get("partial_json") or ""))
        return []

    def _block_stop(self, body: dict[str, Any]) -> list[Event]:
        call, self._call = self._call, None
        return [] if call is None else self._text(call.text(self.backend))

    def _message_delta(self, body: dict[str, Any]) -> list[Event]:
        delta = body.get("delta") or {}
        self._stop_reason = delta.get("stop_reason") or self._stop_reason
        self._stop = delta.get("stop_sequence") or self._stop
        self._merge_usage(body.get("usage"))
        return []

    def _message_stop(self, body: dict[str, Any]) -> list[Event]:
        self.finished = True
        reason = _ANTHROPIC_FINISH.get(self._stop_reason or "end_turn", "stop")
        stop = self._stop if self._stop_reason == "stop_sequence" else None
        return [self._finished(0, reason, anthropic_usage(self._usage), stop)]

    def _text(self, text: Any) -> list[Event]:
        if not isinstance(text, str) or not text:
            return []
        return [self._delta(0, text, self._prompt())]

    def _think(self, text: Any) -> list[Event]:
        if not self._reasoning or not isinstance(text, str) or not text:
            return []  # not passed on: the surface does not split reasoning
        return self._reason(0, text, self._prompt())

    def _prompt(self) -> Usage | None:
        """The prompt's usage, for the first delta only (``message_start`` came before it)."""
        if self._sent_prompt:
            return None
        self._sent_prompt = True
        return _no_completion(anthropic_usage(self._usage))

    def _merge_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self._usage |= {k: v for k, v in usage.items() if v is not None}


def openai_usage(usage: dict[str, Any]) -> Usage:
    """An OpenAI ``usage`` object as ``Usage`` (counts that are missing or invalid: 0)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached),
    )


def anthropic_usage(usage: dict[str, Any]) -> Usage:
    """An Anthropic ``usage`` object as ``Usage``: its ``input_tokens`` excludes the tokens read
    from or written to its cache, which ``prompt_tokens`` counts."""
    cached = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    return Usage(
        prompt_tokens=_count(usage.get("input_tokens")) + cached + written,
        completion_tokens=_count(usage.get("output_tokens")),
        cached_tokens=cached,
    )


def _no_completion(usage: Usage) -> Usage:
    return Usage(
        prompt_tokens=usage.prompt_tokens, completion_tokens=0, cached_tokens=usage.cached_tokens
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
