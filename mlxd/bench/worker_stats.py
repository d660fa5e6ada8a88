"""What an mlxd worker says about a benchmark level: its speculation counters before and after
(``GET /admin/models/{model}/stats``), so `mlxd bench run` reports the level's draft acceptance
and tokens per forward. Other servers have no such endpoint: the columns are then left out."""

from __future__ import annotations

import json
from typing import Any

import httpx

from mlxd.bench.http import Target
from mlxd.config import data_dir
from mlxd.daemon import admin_socket


def fetch(target: Target, model: str) -> dict[str, Any] | None:
    """The worker's counters now, or None (not mlxd, no admin access, or an error). A daemon
    on this host answers on its admin Unix socket (as the mlxd CLI reaches it), else over TCP
    with ``--api-key`` as the bearer (admin over TCP needs the daemon's --admin-key)."""
    path = f"/admin/models/{model}/stats"
    try:
        sock = admin_socket.find(data_dir(), target.base_url)
        if sock is not None:
            conn = admin_socket.UnixHTTPConnection(sock, 10)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                status, raw = resp.status, resp.read()
            finally:
                conn.close()
        else:
            headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
            r = httpx.get(target.base_url.rstrip("/") + path, timeout=10, headers=headers)
            status, raw = r.status_code, r.content
        stats = json.loads(raw)
    except (httpx.HTTPError, OSError, ValueError):
        return None
    ok = status == 200 and isinstance(stats, dict) and "spec_drafted_tokens" in stats
    return stats if ok else None


def speculation(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float]:
    """The level's draft acceptance and tokens per forward from two ``fetch`` answers; empty
    when either is missing or the worker decoded nothing in between."""
    if before is None or after is None:
        return {}
    drafted = after["spec_drafted_tokens"] - before["spec_drafted_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    rows = after["decode_row_forwards"] - before["decode_row_forwards"]
    if rows <= 0:
        return {}
    return {
        "spec_acceptance": accepted / drafted if drafted else 0.0,
        "tokens_per_forward": (rows + accepted) / rows,
    }
