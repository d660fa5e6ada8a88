"""The Responses surface: ``POST /v1/responses`` (validated by ``schemas`` into the chat request
every backend serves, written by ``events`` or ``body``) and the stored responses' routes,
``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``. Errors take
the app's handler: OpenAI's error JSON."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import Opened
from mlxd.gateway.surfaces.base import Surface
from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.responses.body import ResponseShell, output_items
from mlxd.gateway.surfaces.responses.events import response_events
from mlxd.gateway.surfaces.responses.schemas import ResponsesRequest, parse_responses
from mlxd.gateway.surfaces.responses.store import ResponseStore
from mlxd.protocol.messages import Finished, TokenDelta

log = logging.getLogger(__name__)

# Names the tool types a request sent that were not offered to the model (web_search...).
DROPPED_TOOLS_HEADER = "x-mlxd-dropped-tools"
_MAX_LIST = 100


class ResponseRenderer:
    """One response: its shell (id, echoed settings, the store), its events or body."""

    def __init__(self, parsed: ResponsesRequest, store: ResponseStore) -> None:
        self.shell = ResponseShell(parsed, store)

    def frames(self, opened: Opened, first: TokenDelta | Finished) -> AsyncGenerator[bytes, None]:
        """``response.created`` ... ``response.completed``, from ``first`` on."""
        return response_events(opened.stream, first, self.shell, opened.deadline)

    def body(self, opened: Opened, results: list[ChoiceResult]) -> dict[str, Any]:
        """The whole ``response`` object."""
        result = results[0]
        custom = self.shell.parsed.spec.custom_tools
        output = output_items(result.text, result.tool_calls, custom, result.reasoning)
        usage, reason = opened.stream.usage, result.finish_reason
        return self.shell.finish(output, usage, reason, result.reasoning_tokens)


def responses_surface(store: ResponseStore) -> Surface:
    """``/v1/responses``'s surface over ``store``."""

    def parse(body: Any, header_priority: str | None, tier: str | None) -> ResponsesRequest:
        parsed = parse_responses(body, store, header_priority, tier)
        if parsed.spec.dropped_tools:
            dropped = ", ".join(parsed.spec.dropped_tools)
            log.info(
                "tools not offered to %s (this server cannot run them): %s", parsed.model, dropped
            )
        return parsed

    def renderer(parsed: ResponsesRequest) -> ResponseRenderer:
        return ResponseRenderer(parsed, store)

    return Surface("responses", "responses", parse, renderer, headers=dropped_tools_header)


def dropped_tools_header(parsed: ResponsesRequest) -> dict[str, str]:
    """``x-mlxd-dropped-tools: web_search,namespace`` when tools were not offered."""
    dropped = parsed.spec.dropped_tools
    return {DROPPED_TOOLS_HEADER: ",".join(dropped)} if dropped else {}


class StoredResponses:
    """The routes of the stored responses.

    Args:
        store: the gateway's stored responses.
    """

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def retrieve(self, http: Request) -> Response:
        """``GET /v1/responses/{id}``."""
        if http.query_params.get("stream") in ("true", "1"):
            raise InvalidRequest("Streaming a stored response is not supported", param="stream")
        return JSONResponse(self.store.get(http.path_params["response_id"]).response)

    async def delete(self, http: Request) -> Response:
        """``DELETE /v1/responses/{id}``."""
        response_id = http.path_params["response_id"]
        self.store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_items(self, http: Request) -> Response:
        """``GET /v1/responses/{id}/input_items`` (``limit``, ``order``, ``after``)."""
        items = self.store.get(http.path_params["response_id"]).input_items
        query = http.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'", param="order")
        items = items if order == "asc" else items[::-1]
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        limit = _limit(query.get("limit"))
        page = items[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= _MAX_LIST:
        raise InvalidRequest(f"'limit' must be an integer in [1, {_MAX_LIST}]", param="limit")
    return int(value)
