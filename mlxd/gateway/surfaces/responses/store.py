"""Stored responses: what ``store: true`` keeps for ``previous_response_id`` and retrieval.

An in-memory map, bounded by count and by bytes (the JSON size of what each entry holds); the
least recently used entry goes first. Nothing survives a restart. An id that is unknown,
deleted or evicted is a 404 the client can act on (send the whole conversation again), never
a silently shorter conversation.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mlxd.errors import MlxdError
from mlxd.serve_knobs import MAX_STORED_RESPONSES, STORED_RESPONSES_SIZE

log = logging.getLogger(__name__)


class ResponseNotFound(MlxdError):
    """No stored response has this id (never stored, deleted, evicted or from before a restart)."""

    status_code = 404
    type = "invalid_request_error"
    code = "not_found"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One kept response.

    Attributes:
        response: the response object, as its last event or body sent it.
        input_items: the input items of its request, with ids.
        conversation: the chat messages a continuation starts from: the earlier turns, this
            request's input and this response's output (the instructions left out).
        size: its bytes, as the store counts them.
    """

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    size: int


class ResponseStore:
    """The stored responses of this gateway.

    Args:
        max_responses: how many are kept at most (``--max-stored-responses``).
        max_bytes: how many bytes they may hold together; a larger response is not kept
            (``--stored-responses-size``).
    """

    def __init__(
        self,
        max_responses: int = MAX_STORED_RESPONSES.default,
        max_bytes: int = STORED_RESPONSES_SIZE.default,
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        conversation: list[dict[str, Any]],
    ) -> None:
        """Keep ``response`` (under its ``id``), evicting the least recently used as needed."""
        size = len(json.dumps([response, input_items, conversation], ensure_ascii=False))
        if size > self.max_bytes:
            log.warning("response %s (%d bytes) is too large to store", response["id"], size)
            return
        self._drop(response["id"])
        while self._entries and (
            len(self._entries) >= self.max_responses or self.bytes + size > self.max_bytes
        ):
            self._drop(next(iter(self._entries)))
        self._entries[response["id"]] = StoredResponse(response, input_items, conversation, size)
        self.bytes += size

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response ``response_id``; ``param`` names the field that gave the id.

        Raises:
            ResponseNotFound: no such response is stored.
        """
        entry = self._entries.get(response_id)
        if entry is None:
            raise ResponseNotFound(
                f"Response with id {response_id!r} not found (never stored, deleted, or "
                "evicted: send the whole conversation as input instead)",
                param=param,
            )
        self._entries.move_to_end(response_id)
        return entry

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """The chat messages that continue ``response_id`` start from (``get``'s errors)."""
        return list(self.get(response_id, "previous_response_id").conversation)

    def delete(self, response_id: str) -> None:
        """Forget ``response_id`` (``get``'s errors)."""
        self.get(response_id)
        self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
