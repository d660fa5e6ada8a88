"""The worker's embeddings side: validate an ``Embed`` message into an ``EmbedJob``, run the
scheduler's embedding chunks, answer. Kept out of the engine, which only routes to it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlxd.errors import InternalError, InvalidRequest, MlxdError, WorkerUnavailable
from mlxd.protocol.channel import WorkerChannel
from mlxd.protocol.messages import Embed, TextPrompt, TokenPrompt
from mlxd.worker.embedder import Embedder
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.sched.embed_job import EmbedJob
from mlxd.worker.sched.scheduler import EmbedChunk, Scheduler

log = logging.getLogger(__name__)

SendError = Callable[[bytes, str, MlxdError], None]


class EmbedRequests:
    """Embeddings are queued like prompts: each step embeds at most a prefill budget of inputs,
    then decodes, so a 2,048-input request cannot stall the running streams (issue #25)."""

    def __init__(
        self,
        *,
        name: str,
        scheduler: Scheduler,
        encoder: PromptEncoder,
        channel: WorkerChannel,
        max_context: int,
        embedder: Embedder | None,
        send_error: SendError,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.encoder = encoder
        self.channel = channel
        self.max_context = max_context
        self.embedder = embedder
        self.send_error = send_error
        self.clock = clock

    def add(self, client: bytes, msg: Embed, *, draining: bool) -> None:
        """Queue ``msg``'s inputs, or answer at once (an error, or no inputs)."""
        try:
            if draining:
                raise WorkerUnavailable(f"the worker for {self.name!r} is draining")
            if self.embedder is None or not self.embedder.is_supported:
                raise InvalidRequest("this model cannot make embeddings", param="model")
            if self.scheduler.find_embed(msg.request_id, client) is not None:
                raise InvalidRequest(f"request id {msg.request_id!r} is already in flight")
            ids = [self._input(p, i) for i, p in enumerate(msg.inputs)]
        except MlxdError as exc:
            self.send_error(client, msg.request_id, exc)
            return
        job = EmbedJob(
            request_id=msg.request_id, client=client, input_ids=ids, arrival=self.clock()
        )
        if ids:
            self.scheduler.add_embed(job)
        else:
            self.channel.send(client, job.reply())

    def cancel(self, request_id: str, client: bytes) -> None:
        job = self.scheduler.find_embed(request_id, client)
        if job is not None:
            self.scheduler.drop_embed(job)  # its inputs not embedded yet are never computed
            if self.embedder is not None:
                self.embedder.forget(job)

    def run(self, chunks: list[EmbedChunk]) -> None:
        """One forward per chunk, so that a failure fails only its own request."""
        failed: set[str] = set()  # a request may have two chunks in a step (a long input)
        for chunk in chunks:
            job = chunk.job
            assert self.embedder is not None, "an embeddings request queued without an embedder"
            if job.request_id in failed:
                continue
            try:
                self.embedder.run(chunk)
            except (RuntimeError, ValueError) as exc:  # MLX reports failures as these
                log.exception("embedding failed for %s", job.request_id)
                failed.add(job.request_id)
                self.scheduler.drop_embed(job)
                self.embedder.forget(job)
                self.send_error(
                    job.client, job.request_id, InternalError(f"embedding failed: {exc}")
                )
                continue
            if chunk.is_last:
                self.channel.send(job.client, job.reply())

    def _input(self, prompt: TextPrompt | TokenPrompt, index: int) -> list[int]:
        try:
            ids = self.encoder.encode(prompt)
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message, param=f"input[{index}]") from None
        if len(ids) > self.max_context:
            raise InvalidRequest(
                f"input {index} has {len(ids)} tokens; this model's context is "
                f"{self.max_context} tokens",
                param=f"input[{index}]",
            )
        return ids
