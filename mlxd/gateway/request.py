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
from typing import Any

from starlette.requests import Request

from mlxd.gateway.http.accesslog import RequestRecord

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
    """

    http: Request
    record: RequestRecord
    api: str
    endpoint: str
    doc: Any
    timeout_s: float
    parse: Parser
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
            self._parsed = self.parse(self.doc, self.http.headers.get("x-priority"), self.tier)
        return self._parsed

    def for_model(self, name: str) -> ApiRequest:
        """This request sent to ``name`` (a fallback) instead: the body's ``model`` replaced."""
        if name == self.model:
            return self
        doc = {**self.doc, "model": name}
        parsed = None if self._parsed is None else replace(self._parsed, model=name)
        return replace(self, doc=doc, _parsed=parsed)
