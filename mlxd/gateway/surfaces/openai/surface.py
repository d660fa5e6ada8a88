"""The OpenAI surface's generation endpoints, ``/v1/chat/completions`` and ``/v1/completions``:
how each body is validated (``schemas``) and how a local answer is written, streamed as SSE
chunks (``chunks``) or whole (``bodies``). Errors take the app's handler (OpenAI's shape)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from functools import partial
from typing import Any

from mlxd.gateway.request import Opened, ParsedRequest
from mlxd.gateway.surfaces.base import Surface
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.openai import bodies, schemas
from mlxd.gateway.surfaces.openai.chunks import ChatChunks, TextChunks
from mlxd.gateway.surfaces.sse import ChunkFormat, chunk_frames
from mlxd.protocol.messages import Finished, TokenDelta, Usage

_Body = Callable[[str, str, int, list[ChoiceResult], Usage], dict[str, Any]]
_Chunks = Callable[[str, str, int, ParsedRequest], ChunkFormat]


class CompletionRenderer:
    """One OpenAI response: its id and creation time, its chunk format and body builder."""

    def __init__(self, parsed: ParsedRequest, id_prefix: str, chunks: _Chunks, body: _Body):
        self.id = bodies.new_id(id_prefix)
        self.created = int(time.time())
        self._chunks = chunks
        self._body = body

    def frames(self, opened: Opened, first: TokenDelta | Finished) -> AsyncGenerator[bytes, None]:
        """SSE chunks from ``first`` on, then ``[DONE]``."""
        fmt = self._chunks(self.id, opened.parsed.model, self.created, opened.parsed)
        return chunk_frames(opened.stream, first, fmt, opened.deadline)

    def body(self, opened: Opened, results: list[ChoiceResult]) -> dict[str, Any]:
        """The whole ``chat.completion`` or ``text_completion``."""
        model, usage = opened.parsed.model, opened.stream.usage
        return self._body(self.id, model, self.created, results, usage)


def _chat_chunks(completion_id: str, model: str, created: int, p: ParsedRequest) -> ChunkFormat:
    return ChatChunks(
        completion_id,
        model,
        created,
        p.n,
        p.include_usage,
        p.new_tool_parser,
        p.new_reasoning_splitter,
    )


def _text_chunks(completion_id: str, model: str, created: int, p: ParsedRequest) -> ChunkFormat:
    return TextChunks(completion_id, model, created, p.n, p.include_usage)


def _chat_renderer(parsed: ParsedRequest) -> CompletionRenderer:
    body = partial(bodies.chat_completion, reasoning=parsed.reasoning)
    return CompletionRenderer(parsed, "chatcmpl", _chat_chunks, body)


def _text_renderer(parsed: ParsedRequest) -> CompletionRenderer:
    return CompletionRenderer(parsed, "cmpl", _text_chunks, bodies.text_completion)


CHAT = Surface("openai", "chat/completions", schemas.parse_chat, _chat_renderer)
COMPLETIONS = Surface("openai", "completions", schemas.parse_completion, _text_renderer)
