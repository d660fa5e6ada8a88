"""The local backend: serves an ``ApiRequest`` on this daemon's workers.

It takes the request's parsed form (``ApiRequest.parsed``), starts its choices on the model's
worker and hands back an ``Opened`` answer: the worker's event stream (``Choices``) that the
request's surface renders. Embeddings and token counts are one round trip each. A request's
``keep_alive_s`` (Ollama's ``keep_alive``) goes to the pool, which keeps the model loaded that
long once it is idle; how long the request waited for its worker goes on its record.
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import replace
from typing import Any

from mlxd.config import RequestTimeouts
from mlxd.gateway.backends.local.choices import Choices, generates
from mlxd.gateway.backends.local.pool import ModelClient, WorkerPool
from mlxd.gateway.backends.local.workers import StreamObserver
from mlxd.gateway.http.accesslog import RequestRecord, loggable_prompt
from mlxd.gateway.ops.metrics import Metrics
from mlxd.gateway.request import ApiRequest, EmbedRequest, Opened, ParsedRequest
from mlxd.protocol.messages import CountTokens, Embed, Embeddings

MAX_REQUEST_ID_CHARS = 128


class LocalBackend:
    """Requests for models of the worker pool.

    Args:
        pool: model name -> worker client.
        metrics: where requests are counted and timed.
        timeouts: how long a worker may take to describe itself (the chat timeout) or embed.
        log_prompts: whether prompts go to the access log.
    """

    def __init__(
        self, pool: WorkerPool, metrics: Metrics, timeouts: RequestTimeouts, log_prompts: bool
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.timeouts = timeouts
        self.log_prompts = log_prompts
        self._id_prefix = secrets.token_hex(3)
        self._id_counter = itertools.count()

    async def open(self, request: ApiRequest) -> Opened:
        """Start ``request``'s choices on its model's worker.

        Raises:
            MlxdError: the body is invalid, the model unknown or its worker unavailable.
        """
        parsed: ParsedRequest = await request.ready()
        worker = await self._worker(request.record, parsed.model)
        if parsed.parse_tools and not parsed.forced_tool_call:
            described = await worker.describe(self.timeouts.chat_timeout_s)
            parsed = replace(parsed, tool_format=described.tool_parser)
        deadline = time.monotonic() + request.timeout_s
        observer = self._track(request.record, parsed)
        base = parsed.to_generate(self._wire_id(request.record, ""), request.timeout_s)
        request.record.sent_at = time.perf_counter()
        stream = await Choices.open(worker, generates(base, parsed.n), observer)
        # Set once the request is in flight: a keep-alive of 0 unloads the worker after it.
        self.pool.keep_alive(parsed.model, parsed.keep_alive_s)
        return Opened(parsed, stream, deadline, request.record)

    async def embed(self, request: ApiRequest) -> tuple[EmbedRequest, Embeddings]:
        """Embed ``request``'s inputs: the parsed request and the worker's reply."""
        parsed: EmbedRequest = request.parsed()
        worker = await self._worker(request.record, parsed.model)
        request.record.model = parsed.model
        msg = Embed(request_id=self._wire_id(request.record, "emb"), inputs=parsed.inputs)
        reply = await worker.embed(msg, self.timeouts.embeddings_timeout_s)
        request.record.usage = reply.usage
        self.pool.keep_alive(parsed.model, parsed.keep_alive_s)
        return parsed, reply

    async def count_tokens(self, request: ApiRequest) -> int:
        """The number of tokens of ``request``'s prompt, without running the model."""
        parsed: Any = await request.ready()
        worker = await self.pool.client(parsed.model)
        request.record.model = parsed.model
        msg = CountTokens(request_id=self._wire_id(request.record, "count"), prompt=parsed.prompt)
        reply = await worker.count_tokens(msg, self.timeouts.chat_timeout_s)
        return reply.num_tokens

    def model_row(self, name: str, created: int) -> dict[str, Any]:
        """``name``'s ``/v1/models`` entry."""
        # Beyond OpenAI's fields: whether the model is loaded (a request loads it if not), and
        # why it failed (a failed model answers 503 until `mlxd load` tries it again).
        info = self.pool.info(name)
        reason = info.last_error if info.state == "failed" else None
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "mlxd",
            "state": info.state,
            "loaded": info.state == "ready",
            "reason": reason,
            "aliases": info.aliases,
            "replicas": len(info.replica_rows) or 1,
        }

    # Internal helpers

    async def _worker(self, record: RequestRecord, model: str) -> ModelClient:
        """``model``'s worker; how long that took (loading it, if it was not) goes on
        ``record`` (Ollama's ``load_duration``)."""
        start = time.perf_counter()
        try:
            return await self.pool.client(model)
        finally:
            record.load_s = time.perf_counter() - start

    def _wire_id(self, record: RequestRecord, kind: str) -> str:
        """The unique id on the wire of one generation, embedding (``emb``) or count (``count``):
        the client's ``X-Request-Id`` (or the one made for it) and a counter, since clients may
        reuse theirs."""
        unique = f"{kind}{self._id_prefix}{next(self._id_counter):x}"
        return f"{record.request_id[:MAX_REQUEST_ID_CHARS]}.{unique}"

    def _track(self, record: RequestRecord, parsed: ParsedRequest) -> StreamObserver:
        record.model, record.stream = parsed.model, parsed.stream
        if self.log_prompts:
            record.prompt = loggable_prompt(parsed.prompt)
        return self.metrics.track(record)
