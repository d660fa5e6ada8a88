"""``RecentRequests``: the status page's last API requests, newest first, never the prompt."""

from __future__ import annotations

import time

from mlxd.config import ApiKey
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.ops.recent import RecentRequests


def _record(request_id: str, method: str = "POST", path: str = "/v1/completions") -> RequestRecord:
    start = time.perf_counter()
    record = RequestRecord(request_id, method, path, start, end=start + 0.25, status=200)
    record.model, record.key, record.prompt = "m", ApiKey(name="eve", key="sk-eve-1"), "SECRET"
    return record


def test_keeps_the_newest_api_requests_first() -> None:
    recent = RecentRequests(size=2)
    for request_id in ("a", "b", "c"):
        recent.add(_record(request_id))
    assert [row["request_id"] for row in recent.rows()] == ["c", "b"]


def test_leaves_out_polls_and_admin_calls() -> None:
    recent = RecentRequests()
    recent.add(_record("poll", "GET", "/admin/overview"))
    recent.add(_record("models", "GET", "/v1/models"))
    recent.add(_record("unload", "POST", "/admin/models/m/unload"))
    assert recent.rows() == []


def test_a_row_has_the_key_name_and_times_but_no_prompt() -> None:
    recent = RecentRequests()
    before = time.time()
    recent.add(_record("a"))
    [row] = recent.rows()
    assert row["key"] == "eve" and row["e2e_ms"] == 250.0 and "prompt" not in row
    assert before - 1 < row["time"] <= time.time() + 0.01
    assert "SECRET" not in repr(row) and "sk-eve-1" not in repr(row)
