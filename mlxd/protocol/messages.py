"""Every message that crosses a process boundary, as frozen dataclasses.

Each class has a wire ``TAG``. A frame set is ``[PROTOCOL_VERSION, msgpack({"type": TAG, ...})]``;
see docs/protocol.md. New features get new message types rather than optional fields on old ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = b"mlxd/1"

PRIORITIES = ("high", "normal", "low")


# Prompts: a tagged union, so the worker never guesses which field is set.


@dataclass(frozen=True, kw_only=True)
class ChatPrompt:
    """A chat rendered by the worker with the model's chat template.

    ``messages`` are OpenAI-shaped dicts (role, content, and optionally name, tool_calls...).
    """

    TAG: ClassVar[str] = "chat"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True, kw_only=True)
class TextPrompt:
    """Raw text, tokenized as is (``/v1/completions``)."""

    TAG: ClassVar[str] = "text"
    text: str


@dataclass(frozen=True, kw_only=True)
class TokenPrompt:
    """Pre-tokenized input (``/v1/completions`` with a list of ints)."""

    TAG: ClassVar[str] = "tokens"
    token_ids: list[int]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples; every request in a batch has its own."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts of one finished request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


# Gateway -> worker (data plane)


@dataclass(frozen=True, kw_only=True)
class Generate:
    """Start one completion. The worker answers with TokenDelta* then Finished, or an Error."""

    TAG: ClassVar[str] = "generate"
    request_id: str
    prompt: Prompt
    sampling: SamplingParams
    priority: str = "normal"
    timeout_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Cancel:
    """Stop a request (client gone, timeout, admin). The worker sends nothing more for it."""

    TAG: ClassVar[str] = "cancel"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class Ping:
    """Liveness probe; answered with a Pong carrying the same request_id."""

    TAG: ClassVar[str] = "ping"
    request_id: str


# Worker -> gateway


@dataclass(frozen=True, kw_only=True)
class Pong:
    """Answer to Ping: the worker is alive and says what it serves."""

    TAG: ClassVar[str] = "pong"
    request_id: str
    model: str
    max_context: int


@dataclass(frozen=True, kw_only=True)
class TokenDelta:
    """New output of one request: the text that is now final and the token ids behind it."""

    TAG: ClassVar[str] = "token_delta"
    request_id: str
    text: str
    token_ids: list[int]


@dataclass(frozen=True, kw_only=True)
class Finished:
    """The request is complete. ``finish_reason`` is "stop", "length" or "cancelled"."""

    TAG: ClassVar[str] = "finished"
    request_id: str
    finish_reason: str
    usage: Usage
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class Error:
    """The request failed; the worker keeps running. ``code`` is an ``mlxd.errors`` code."""

    TAG: ClassVar[str] = "error"
    request_id: str
    code: str
    message: str
    param: str | None = None


Event = TokenDelta | Finished | Error


@dataclass(frozen=True, kw_only=True)
class Events:
    """Several events in one frame: the worker coalesces a decode step's output per client."""

    TAG: ClassVar[str] = "events"
    events: list[Event]


Message = Generate | Cancel | Ping | Pong | TokenDelta | Finished | Error | Events

MESSAGE_TYPES: tuple[type, ...] = (Generate, Cancel, Ping, Pong, TokenDelta, Finished, Error, Events)
