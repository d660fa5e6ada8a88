"""The durations in Ollama's last message (nanoseconds), read off the request's record.

The backends time every request on its ``RequestRecord``, whatever its surface: ``load_s``
(the local backend's wait for the model's worker, loading it if it was not loaded),
``sent_at`` (the request went to its worker or upstream), ``first_token_at`` and ``done_at``
(its first and last events came). So ``load_duration`` is that wait, ``prompt_eval_duration``
runs from sending to the first token (prefill), ``eval_duration`` from the first token to the
last, and ``total_duration`` from the request's arrival to its last token.
"""

from __future__ import annotations

import time

from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.protocol.messages import Usage


def durations(record: RequestRecord, usage: Usage) -> dict[str, int]:
    """Ollama's duration and count fields of a generation."""
    done = record.done_at or time.perf_counter()
    first = record.first_token_at or done
    return {
        "total_duration": _ns(done - record.start),
        "load_duration": _ns(record.load_s),
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": _ns(first - (record.sent_at or record.start)),
        "eval_count": usage.completion_tokens,
        "eval_duration": _ns(done - first),
    }


def embed_durations(record: RequestRecord) -> dict[str, int]:
    """Ollama's duration fields of an embedding: all of it, and the load within it."""
    return {
        "total_duration": _ns(time.perf_counter() - record.start),
        "load_duration": _ns(record.load_s),
    }


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))
