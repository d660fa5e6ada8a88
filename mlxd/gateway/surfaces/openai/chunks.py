"""Streamed OpenAI objects: ``chat.completion.chunk`` and streamed ``text_completion``.

One instance serves one response of ``n`` choices; ``sse.chunk_frames`` calls ``head`` once,
``delta`` and ``finish`` per choice event (each names its choice ``index``), and ``tail`` once
every choice has finished.
"""

from __future__ import annotations

from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from mlxd.gateway.surfaces.openai.bodies import finish_reason, usage_dict
from mlxd.gateway.surfaces.openai.logprobs import chat_logprobs, completion_logprobs
from mlxd.gateway.surfaces.sse import sse
from mlxd.gateway.tools.calls import ToolCall, ToolCallParser
from mlxd.gateway.tools.reasoning import ReasoningSplitter, Split
from mlxd.protocol.messages import Finished, TokenDelta, TokenLogprob, Usage

_MARK = "mlxd-text-mark-5f0c"  # where a chunk's text goes in a frame template


class _Chunks:
    object_name = ""

    def __init__(
        self, completion_id: str, model: str, created: int, n: int = 1, include_usage: bool = False
    ) -> None:
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.n = n
        self.include_usage = include_usage
        self._templates: dict[int, tuple[bytes, bytes] | None] = {}

    def head(self) -> list[dict[str, Any]]:
        return []

    def delta(
        self, index: int, text: str, logprobs: list[TokenLogprob] | None = None
    ) -> list[dict[str, Any]]:
        choice = self._choice(index, text, None)
        choice["logprobs"] = self._logprobs(index, logprobs)
        return [self._chunk(choice)]

    def token_delta(self, index: int, delta: TokenDelta) -> list[dict[str, Any]]:
        if not delta.text and not delta.logprobs:
            return []
        return self.delta(index, delta.text, delta.logprobs)

    def _plain_delta(self, index: int, text: str) -> dict[str, Any]:
        return _Chunks.delta(self, index, text)[0]

    def text_frame(self, index: int, text: str) -> bytes | None:
        """The SSE frame of ``delta(index, text)`` with no logprobs, byte for byte, made from a
        template: most frames of a stream are just new text, and building and serializing a
        chunk's dicts for each was a large part of the gateway's cost per token."""
        if index not in self._templates:
            self._templates[index] = _template(sse(self._plain_delta(index, _MARK)))
        template = self._templates[index]
        if template is None:
            return None
        head, tail = template
        return head + encode_basestring(text).encode() + tail

    def finish(self, index: int, finished: Finished) -> list[dict[str, Any]]:
        out = self.delta(index, finished.text) if finished.text else []
        out.append(self._chunk(self._choice(index, None, finished.finish_reason)))
        return out

    def tail(self, usage: Usage) -> list[dict[str, Any]]:
        return [self._chunk(None, usage=usage_dict(usage))] if self.include_usage else []

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        return chat_logprobs(entries)

    def _choice(self, index: int, text: str | None, reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def _chunk(
        self, choice: dict[str, Any] | None, usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        chunk = {
            "id": self.completion_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": [] if choice is None else [choice],
        }
        if self.include_usage:
            chunk["usage"] = usage
        return chunk


class ChatChunks(_Chunks):
    """Builds ``chat.completion.chunk`` objects; each choice's first carries ``delta.role``.

    With ``new_parser`` (tools were given), text inside the model's tool-call markers is held
    back and sent as ``delta.tool_calls`` once each call is complete. With ``new_splitter``
    (the request splits thinking), thinking text goes out as ``delta.reasoning_content``, split
    first, so tool calls are looked for in the answer only, and ``usage`` counts
    ``completion_tokens_details.reasoning_tokens``.
    """

    object_name = "chat.completion.chunk"

    def __init__(
        self,
        completion_id: str,
        model: str,
        created: int,
        n: int = 1,
        include_usage: bool = False,
        new_parser: Callable[[], ToolCallParser | None] | None = None,
        new_splitter: Callable[[], ReasoningSplitter | None] | None = None,
    ) -> None:
        super().__init__(completion_id, model, created, n, include_usage)
        parsers = [new_parser() for _ in range(n)] if new_parser is not None else []
        self._parsers = [p for p in parsers if p is not None] or None
        splitters = [new_splitter() for _ in range(n)] if new_splitter is not None else []
        self._splitters = [s for s in splitters if s is not None] or None

    def head(self) -> list[dict[str, Any]]:
        return [
            self._chunk(
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            for i in range(self.n)
        ]

    def delta(
        self, index: int, text: str, logprobs: list[TokenLogprob] | None = None
    ) -> list[dict[str, Any]]:
        if self._parsers is None:
            return super().delta(index, text, logprobs)
        parser = self._parsers[index]
        done = parser.num_calls
        content, calls = parser.feed(text)
        out = super().delta(index, content, logprobs) if content or logprobs else []
        return out + self._calls(index, calls, done)

    def token_delta(self, index: int, delta: TokenDelta) -> list[dict[str, Any]]:
        if self._splitters is None:
            return super().token_delta(index, delta)
        split = self._splitters[index].delta(delta)
        return self._split(index, split, delta.logprobs)

    def text_frame(self, index: int, text: str) -> bytes | None:
        if self._parsers is not None or self._splitters is not None:
            return None
        return super().text_frame(index, text)

    def finish(self, index: int, finished: Finished) -> list[dict[str, Any]]:
        if self._splitters is not None:
            splitter = self._splitters[index]
            out = self._split(index, splitter.feed(finished.text))
            out += self._split(index, splitter.finish())
        else:
            out = self.delta(index, finished.text) if finished.text else []
        has_calls = False
        if self._parsers is not None:
            parser = self._parsers[index]
            done = parser.num_calls
            content, calls = parser.finish()
            out += super().delta(index, content) if content else []
            out += self._calls(index, calls, done)
            has_calls = parser.num_calls > 0
        reason = finish_reason(finished.finish_reason, has_calls)
        return [*out, self._chunk(self._choice(index, None, reason))]

    def tail(self, usage: Usage) -> list[dict[str, Any]]:
        if not self.include_usage or self._splitters is None:
            return super().tail(usage)
        thinking = sum(s.tokens for s in self._splitters)
        return [self._chunk(None, usage=usage_dict(usage, thinking))]

    def _split(
        self, index: int, split: Split, logprobs: list[TokenLogprob] | None = None
    ) -> list[dict[str, Any]]:
        """Thinking first (``delta.reasoning_content``), then the answer (and its calls)."""
        out = []
        if split.reasoning:
            delta = {"reasoning_content": split.reasoning}
            out.append(
                self._chunk(
                    {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                )
            )
        if split.answer or logprobs:
            out += self.delta(index, split.answer, logprobs)
        return out

    def _calls(self, index: int, calls: list[ToolCall], done: int) -> list[dict[str, Any]]:
        return [
            self._chunk(
                {
                    "index": index,
                    "delta": {"tool_calls": [c.to_openai(done + k)]},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            for k, c in enumerate(calls)
        ]

    def _choice(self, index: int, text: str | None, reason: str | None) -> dict[str, Any]:
        delta = {} if text is None else {"content": text}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}


class TextChunks(_Chunks):
    """Builds streamed ``text_completion`` objects."""

    object_name = "text_completion"

    def __init__(
        self, completion_id: str, model: str, created: int, n: int = 1, include_usage: bool = False
    ) -> None:
        super().__init__(completion_id, model, created, n, include_usage)
        self._offsets = [0] * n  # characters of each choice's output so far: next text_offset

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        out = completion_logprobs(entries, self._offsets[index])
        if out is not None:
            self._offsets[index] += sum(len(t) for t in out["tokens"])
        return out

    def _choice(self, index: int, text: str | None, reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}


def _template(frame: bytes) -> tuple[bytes, bytes] | None:
    """``frame`` split around its one JSON-encoded ``_MARK`` (``None`` if it is not there once:
    an id or model name that holds the mark)."""
    mark = encode_basestring(_MARK).encode()
    if frame.count(mark) != 1:
        return None
    head, tail = frame.split(mark)
    return head, tail
