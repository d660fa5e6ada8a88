"""The one internal request every API surface reads into, and the router and backends take.

A request's path reads left to right: its surface reads the body once into an ``ApiRequest``
(the JSON as the client sent it, and the fields routing needs), the router picks its targets,
and a backend serves it. A remote backend of the client's own API gets ``doc`` as it came (with
its own model name); one of the other API, or a local worker, gets ``parsed()``: the validated
protocol request, parsed once however many fallbacks the request goes through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from starlette.requests import Request

from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.images.fetch import ImageFetcher
from mlxd.gateway.images.limits import ImageLimits, parsing_with
from mlxd.gateway.tools.calls import ToolCallParser
from mlxd.gateway.tools.formats import tool_format
from mlxd.gateway.tools.reasoning import ReasoningSplitter
from mlxd.protocol.messages import (
    ChatPrompt,
    Finished,
    Generate,
    Prompt,
    SamplingParams,
    TextPrompt,
    TokenDelta,
    TokenPrompt,
    Usage,
)

# body, X-Priority, the key's tier -> the surface's validated request (``ParsedRequest`` or an
# embeddings request).
Parser = Callable[[Any, "str | None", "str | None"], Any]


@dataclass(slots=True)
class ApiRequest:
    """One API call, read once by its surface.

    Attributes:
        http: the Starlette request (headers, disconnects).
        record: its access-log record (request id, key, model, usage).
        api: the client's wire family, ``"openai"`` or ``"anthropic"``.
        endpoint: the API path under ``/v1/``: ``chat/completions``, ``completions``,
            ``messages`` or ``embeddings``.
        doc: the JSON body as sent (any JSON value: the parser explains what is wrong).
        timeout_s: how long the request may take end to end.
        parse: the surface's validator, applied once by ``parsed``.
        images: the gateway's image limits and URL fetcher (``ready`` fetches).
    """

    http: Request
    record: RequestRecord
    api: str
    endpoint: str
    doc: Any
    timeout_s: float
    parse: Parser
    images: ImageFetcher | None = None
    _parsed: Any = field(default=None, repr=False)

    @property
    def model(self) -> str | None:
        """The ``model`` the client asked for, if the body names one."""
        name = self.doc.get("model") if isinstance(self.doc, dict) else None
        return name if isinstance(name, str) else None

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return isinstance(self.doc, dict) and self.doc.get("stream") is True

    @property
    def tier(self) -> str | None:
        """The API key's priority tier, if a key with one was used."""
        return None if self.record.key is None else self.record.key.tier

    def parsed(self) -> Any:
        """The validated request; ``MlxdError`` (400) when the body is wrong."""
        if self._parsed is None:
            limits = ImageLimits() if self.images is None else self.images.limits
            with parsing_with(limits):
                self._parsed = self.parse(self.doc, self.http.headers.get("x-priority"), self.tier)
        return self._parsed

    async def ready(self) -> Any:
        """``parsed()`` with its image URLs fetched: what a backend serves (a pass-through
        relay sends ``doc`` as it came, URLs and all)."""
        parsed = self.parsed()
        if self.images is not None:
            self._parsed = parsed = await self.images.fill(parsed)
        return parsed

    def for_model(self, name: str) -> ApiRequest:
        """This request sent to ``name`` (a fallback) instead: the body's ``model`` replaced."""
        if name == self.model:
            return self
        doc = {**self.doc, "model": name}
        parsed = None if self._parsed is None else replace(self._parsed, model=name)
        return replace(self, doc=doc, _parsed=parsed)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated ``/v1/chat/completions`` or ``/v1/completions`` body."""

    model: str
    prompt: Prompt
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    priority: str = "normal"
    n: int = 1
    parse_tools: bool = False  # split tool calls out of the output
    max_tool_calls: int | None = None  # 1 when parallel_tool_calls is false
    forced_tool_call: bool = False  # the output is one call's JSON body (tool_choice)
    tool_format: str | None = None  # the worker's tool parser (mlx-lm's name); None: JSON
    reasoning: bool = False  # split thinking text out of the answer (where the model marks it)
    user: str | None = None  # the end user's id (OpenAI ``user``), for a remote backend
    # Sampling fields the surface filled in with its own defaults (Ollama's temperature 0.8,
    # top_k 40, top_p 0.9), the client not having sent them: a remote backend is not sent
    # them (its own defaults hold) and never refuses the request for them.
    defaulted: frozenset[str] = frozenset()
    # What the surface's response repeats about how the request was read (Anthropic's
    # ``context_management`` report).
    echo: dict[str, Any] = field(default_factory=dict)
    # How long a local model stays loaded once this request is done (Ollama's ``keep_alive``):
    # 0 unloads it, negative keeps it loaded; ``None``: the server's keep-alive.
    keep_alive_s: float | None = None

    def new_reasoning_splitter(self) -> ReasoningSplitter | None:
        """A splitter for one choice's thinking and answer; ``None`` when not split. It learns
        the model's markers from the choice's first ``TokenDelta`` (``splitter.delta``)."""
        return ReasoningSplitter() if self.reasoning else None

    def new_tool_parser(self) -> ToolCallParser | None:
        """A parser for one choice's tool calls; ``None`` when calls are not parsed."""
        if not self.parse_tools:
            return None
        tools = self.prompt.tools if isinstance(self.prompt, ChatPrompt) else None
        fmt = tool_format(self.tool_format)
        return ToolCallParser(self.max_tool_calls, self.forced_tool_call, fmt, tools)

    def to_generate(self, request_id: str, timeout_s: float | None) -> Generate:
        """The ``Generate`` message that starts this request on a worker."""
        return Generate(
            request_id=request_id,
            prompt=self.prompt,
            sampling=self.sampling,
            priority=self.priority,
            timeout_s=timeout_s,
        )


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """A validated ``/v1/embeddings`` body."""

    model: str
    inputs: list[TextPrompt | TokenPrompt]
    encoding: str  # "float" or "base64"
    keep_alive_s: float | None = None  # as ``ParsedRequest.keep_alive_s``


class EventStream(Protocol):
    """The internal event stream a backend answers with and a surface renders: the events of a
    request's ``n`` choices (``TokenDelta`` then ``Finished`` for each), in arrival order. The
    local backend's is ``Choices``."""

    request_id: str

    def __aiter__(self) -> EventStream: ...

    async def __anext__(self) -> TokenDelta | Finished: ...

    def next_ready(self) -> TokenDelta | Finished | None:
        """The next event if one is already waiting, else ``None`` (never waits)."""
        ...

    @property
    def num_choices(self) -> int:
        """How many choices the request has (``n``)."""
        ...

    @property
    def is_done(self) -> bool:
        """True once every choice has finished."""
        ...

    def index(self, event: TokenDelta | Finished) -> int:
        """The choice an event belongs to."""
        ...

    @property
    def usage(self) -> Usage:
        """The usage of the choices finished so far, counted as one request."""
        ...

    async def cancel(self) -> None:
        """Stop every choice still running. Idempotent."""
        ...


@dataclass(slots=True)
class Opened:
    """A parsed request whose answer has started: what its surface renders."""

    parsed: ParsedRequest
    stream: EventStream
    deadline: float  # time.monotonic() by which the request must finish
    record: RequestRecord  # its times: arrival, load, sent, first and last token
