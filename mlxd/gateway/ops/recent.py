"""The last API requests the gateway finished, for the status page and ``GET /admin/overview``.

A fixed-size ring fed by the access log's ``on_finish``: the same fields as the ``mlxd.access``
line (time, model, status, tokens, TTFT, duration, key *name*) and never the prompt, whatever
``--log-prompts`` says, so nothing a client sent can leak onto a page that others may read.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from mlxd.gateway.http.accesslog import RequestRecord, access_fields

MAX_RECENT = 50
API_PREFIX = "/v1/"


class RecentRequests:
    """The newest ``size`` finished ``POST /v1/*`` requests; polls and admin calls are left out.

    Args:
        size: how many requests are kept (the oldest go first).
    """

    def __init__(self, size: int = MAX_RECENT) -> None:
        self._rows: deque[dict[str, Any]] = deque(maxlen=size)

    def add(self, record: RequestRecord) -> None:
        """Keep ``record`` if it was an API call (an ``AccessLog`` ``on_finish`` callback)."""
        if record.method != "POST" or not record.path.startswith(API_PREFIX):
            return
        row = access_fields(record)  # no prompt: built from the record, not the log line
        # The record's times are perf_counter readings; the page wants the wall clock.
        row["time"] = round(time.time() - (time.perf_counter() - record.start), 3)
        self._rows.append(row)

    def rows(self) -> list[dict[str, Any]]:
        """The kept requests, newest first."""
        return list(reversed(self._rows))
