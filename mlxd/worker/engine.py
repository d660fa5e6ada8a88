"""The worker's loop: receive, schedule, run the model, send. Owns nothing but wiring."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mlxd.errors import (
    InternalError,
    InvalidRequest,
    MlxdError,
    OutOfMemory,
    Overloaded,
    ProtocolError,
    RequestTimeout,
    WorkerUnavailable,
)
from mlxd.protocol.channel import WorkerChannel
from mlxd.protocol.messages import (
    Cancel,
    ChatPrompt,
    CountTokens,
    Embed,
    Error,
    Event,
    Events,
    Finished,
    Generate,
    Message,
    Ping,
    Pong,
    TokenCount,
    TokenDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from mlxd.protocol.validate import check_priority, check_sampling
from mlxd.worker.embed_requests import EmbedRequests
from mlxd.worker.embedder import Embedder
from mlxd.worker.idle_release import IdleRelease
from mlxd.worker.runners.base import ModelRunner, TokenEvent
from mlxd.worker.sampling.detokenizer import OutputText
from mlxd.worker.sampling.grammar import Grammar, valid_drafts
from mlxd.worker.sampling.thinking import ThinkingBudget
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.sched.oom_backoff import OomBackoff
from mlxd.worker.sched.scheduler import EmbedChunk, PrefillChunk, Scheduler
from mlxd.worker.sched.sequence import PRIORITY_LEVELS, Sequence
from mlxd.worker.spec.speculator import Drafter, Speculator, resolve
from mlxd.worker.stats import Stats

if TYPE_CHECKING:
    from concurrent.futures import Future

    from mlxd.worker.control import Control
    from mlxd.worker.vision.encoder import ImageEncoder, Prepared

log = logging.getLogger(__name__)

OOM_RETRIES = 2  # times a request is computed again after the device ran out of memory
# Failed steps in a row after which the worker says it is failing (``Pong.failing``): one bad
# request fails one step, so this many means the model itself fails. A decode step that works or
# a request that completes resets the count (a prefill alone does not: decode may be what fails).
MAX_FAILED_STEPS = 5
# How MLX's backends word running out of memory (CUDA, Metal, the CPU allocator).
_OOM_WORDS = (
    "out of memory",
    "insufficient memory",
    "outofmemory",
    "unable to allocate",
    "maximum allowed buffer size",
)


TEXT_ONLY = "a text-only model"  # why a model with no image encoder refuses images


class Engine:
    """Continuous batching: requests join and leave between decode steps."""

    def __init__(
        self,
        *,
        name: str,
        runner: ModelRunner,
        scheduler: Scheduler,
        encoder: PromptEncoder,
        channel: WorkerChannel,
        max_context: int,
        clock: Callable[[], float] | None = None,
        embedder: Embedder | None = None,
        drafter: Drafter | None = None,
        vision: ImageEncoder | None = None,
    ) -> None:
        """``drafter``: the draft model of ``--speculate draft`` (unused where the runner
        cannot speculate); ``vision``: a VLM's image encoder (None: the model takes no images).
        """
        self.name = name
        self.runner = runner
        self.scheduler = scheduler
        self.encoder = encoder
        self.channel = channel
        self.max_context = max_context
        self.embedder = embedder
        self.vision = vision
        self.images_refused = TEXT_ONLY  # why an image is refused where ``vision`` is None
        # Image requests whose images are being prepared off this thread (``vision``).
        self._preparing: list[tuple[bytes, Generate, Future[Prepared]]] = []
        # One clock for arrival times and for aging: by default, the scheduler's.
        self.clock = clock or scheduler.clock
        self.should_exit = False
        self.stats = Stats(self.clock)
        self.idle_release = IdleRelease(0)  # build.py sets --kv-idle-s (0 here: never)
        mode = resolve(scheduler.config.speculate) if runner.speculates else "off"
        # Drafts and whether the batch verifies them.
        self.speculator = Speculator(mode, drafter=drafter if mode == "draft" else None)
        self.stats.speculator = self.speculator
        self.stats.vision = vision
        self.embeddings = EmbedRequests(
            name=name,
            scheduler=scheduler,
            encoder=encoder,
            channel=channel,
            max_context=max_context,
            embedder=embedder,
            send_error=self._send_error,
            clock=self.clock,
        )
        # Control plane state (worker/control.py sets these between steps).
        self.control: Control | None = None
        self.paused = False
        self.draining = False  # refuse new requests, finish the rest
        self.exit_when_drained = False
        self.num_failed_steps = 0
        self.oom_backoff = OomBackoff()  # raises max_num_seqs again after out-of-memory errors
        self.failing = ""  # why every recent step failed; read by ``pong`` on the control thread
        self.warming = ""  # the warm-up stage running (worker/warmup.py); "" once it serves
        self._outbox: dict[bytes, list[Event]] = {}
        # When the engine thread last started a loop iteration; the control thread reads it.
        self._loop_at = time.monotonic()
        self._handlers: dict[type, Callable[[bytes, Any], None]] = {
            Generate: self._on_generate,
            Cancel: self._on_cancel,
            Embed: self._on_embed,
            CountTokens: self._on_count_tokens,
            Ping: self._on_ping,
        }

    def run(self) -> None:
        while not self.should_exit:
            self._loop_at = time.monotonic()
            busy = self.scheduler.has_work() and not self.paused
            wait = 0 if busy else 5 if self._preparing else 50
            for client, msg in self.channel.recv_ready(timeout_ms=wait):
                self.dispatch(client, msg)
            if self._preparing:
                self._admit_prepared()
            if self.control is not None:
                self.control.poll()
            if self.scheduler.has_work() and not self.paused:
                self.step()
                continue
            self.stats.on_idle()
            self.idle_release.idle(self.runner, self.scheduler)
            if self.exit_when_drained and not self.scheduler.has_work():
                self.should_exit = True

    def dispatch(self, client: bytes, msg: Message | ProtocolError) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(client, msg)
            return
        err = (
            msg
            if isinstance(msg, ProtocolError)
            else ProtocolError(f"a worker does not accept {type(msg).__name__} messages")
        )
        request_id = getattr(msg, "request_id", "")
        self.channel.send(client, Error(request_id=request_id, code=err.code, message=err.message))

    def step(self) -> None:
        """One scheduling iteration: expire, retire, prefill and embed a token budget, decode."""
        self.idle_release.busy()
        self._expire()
        self._retire()
        decoded = 0
        work = self.scheduler.schedule_prefill(admit=self.runner.has_room())
        self.embeddings.run([c for c in work if isinstance(c, EmbedChunk)])
        chunks = [c for c in work if isinstance(c, PrefillChunk)]
        if chunks:
            self._prefill(chunks)
            self._flush()  # first tokens go now, not after the decode step is built and launched
            self._retire()  # done at their first token: no decode step for them
        speculate = False
        if self.runner.rows:
            speculate = self.speculator.wants(self.runner.rows)  # drafts follow the last token
            if speculate or self.runner.needs_sync():
                self._accept(self.runner.sync())
                self._retire()
            self._reserve()
            if self.runner.rows:
                decoded = len(self.runner.rows)
                self._decode(speculate)
        self._retire()  # free what finished now, not one step later
        self._flush()
        self.stats.on_step(decoded)
        if decoded:
            self.speculator.on_step(speculate, decoded, clean=not chunks)

    # Message handlers

    def _on_generate(self, client: bytes, msg: Generate) -> None:
        try:
            if self.draining:
                raise WorkerUnavailable(f"the worker for {self.name!r} is draining")
            if self.scheduler.find(msg.request_id, client) is not None:
                raise InvalidRequest(f"request id {msg.request_id!r} is already in flight")
            if isinstance(msg.prompt, ChatPrompt) and msg.prompt.images:
                self._prepare_images(client, msg)
                return
            seq = self._new_sequence(client, msg)
            self.scheduler.add(seq)
            self.stats.on_admit(seq)
        except MlxdError as exc:
            self.stats.on_refuse(exc)
            self._send_error(client, msg.request_id, exc)

    def _prepare_images(self, client: bytes, msg: Generate) -> None:
        """Render the chat and hand it with its images to the encoder's threads; the request
        joins the scheduler once they are ready (``_admit_prepared``)."""
        assert isinstance(msg.prompt, ChatPrompt) and msg.prompt.images
        if self.vision is None:
            raise InvalidRequest(
                f"model {self.name!r} does not take images ({self.images_refused})",
                param="messages",
            )
        check_sampling(msg.sampling)
        check_priority(msg.priority)
        text = self.encoder.render_chat(msg.prompt)
        self._preparing.append((client, msg, self.vision.prepare(text, msg.prompt.images)))

    def _admit_prepared(self) -> None:
        """Requests whose images are ready join the scheduler; a bad image fails its own."""
        ready = [p for p in self._preparing if p[2].done()]
        self._preparing = [p for p in self._preparing if not p[2].done()]
        for client, msg, future in ready:
            try:
                seq = self._new_sequence(client, msg, future.result())
                self.scheduler.add(seq)
                self.stats.on_admit(seq)
            except MlxdError as exc:
                self.stats.on_refuse(exc)
                self._send_error(client, msg.request_id, exc)
            except Exception as exc:  # noqa: BLE001 - a processor's own failure fails one request
                log.exception("preparing the images of %s failed", msg.request_id)
                self._send_error(client, msg.request_id, InvalidRequest(f"bad image: {exc}"))

    def _on_cancel(self, client: bytes, msg: Cancel) -> None:
        self.embeddings.cancel(msg.request_id, client)
        waiting = [
            p for p in self._preparing if p[0] == client and p[1].request_id == msg.request_id
        ]
        for pending in waiting:  # still preparing: it never reaches the scheduler
            pending[2].cancel()
            self._preparing.remove(pending)
        seq = self.scheduler.find(msg.request_id, client)
        if seq is not None:
            self.scheduler.finish(seq, "cancelled")  # nothing more is ever sent for it
            self.stats.on_finish(seq, "cancelled")
            # Free its KV now: with no other work no step would run to retire it.
            self.runner.remove({seq})
            self.speculator.forget()

    def _on_embed(self, client: bytes, msg: Embed) -> None:
        self.embeddings.add(client, msg, draining=self.draining)

    def _on_count_tokens(self, client: bytes, msg: CountTokens) -> None:
        try:
            num_tokens = len(self.encoder.encode(msg.prompt))
        except MlxdError as exc:
            self._send_error(client, msg.request_id, exc)
            return
        self.channel.send(client, TokenCount(request_id=msg.request_id, num_tokens=num_tokens))

    def _on_ping(self, client: bytes, msg: Ping) -> None:
        self.channel.send(client, self.pong(msg))

    def pong(self, msg: Ping) -> Pong:
        """The answer to a ping. Safe on any thread: it reads fields set once, and a float."""
        busy_s = max(0.0, time.monotonic() - self._loop_at)
        return Pong(
            request_id=msg.request_id,
            model=self.name,
            max_context=self.max_context,
            tool_parser=self.encoder.tool_parser,
            busy_s=round(busy_s, 3),
            failing=self.failing,
            warming=self.warming,
        )

    # Internal helpers

    def _new_sequence(
        self, client: bytes, msg: Generate, prepared: Prepared | None = None
    ) -> Sequence:
        """``prepared``: an image request's ids, images and keys (``vision.encoder``)."""
        check_sampling(msg.sampling)
        check_priority(msg.priority)
        prompt_ids = self.encoder.encode(msg.prompt) if prepared is None else prepared.prompt_ids
        room = self.max_context - len(prompt_ids)
        if room < 1:
            raise InvalidRequest(
                f"the prompt has {len(prompt_ids)} tokens; this model's context is "
                f"{self.max_context} tokens",
                param="messages" if msg.prompt.TAG == "chat" else "prompt",
            )
        max_tokens = msg.sampling.max_tokens or room
        if max_tokens > room:
            raise InvalidRequest(
                f"max_tokens is {max_tokens} but only {room} tokens fit after the "
                f"{len(prompt_ids)}-token prompt in the {self.max_context}-token context",
                param="max_tokens",
            )
        now = self.clock()
        seed = msg.sampling.seed if msg.sampling.seed is not None else random.getrandbits(63)
        seq = Sequence(
            request_id=msg.request_id,
            client=client,
            prompt_ids=prompt_ids,
            sampling=msg.sampling,
            max_tokens=max_tokens,
            priority=PRIORITY_LEVELS[msg.priority],
            arrival=now,
            deadline=now + msg.timeout_s if msg.timeout_s else None,
            seed=seed,
        )
        if prepared is not None:
            seq.images, seq.prompt_keys = prepared.images, prepared.keys
        seq.detok = OutputText(self.encoder.new_detokenizer(), msg.sampling.stop)
        if msg.sampling.logprobs:
            self.encoder.token_vocab("logprobs")  # token bytes: fail now, not mid-stream
        if msg.sampling.response_format is not None:
            vocab = self.encoder.token_vocab("response_format")
            seq.grammar = Grammar.compile(msg.sampling.response_format, vocab)
        self._mark_thinking(seq)
        return seq

    def _mark_thinking(self, seq: Sequence) -> None:
        """How ``seq``'s output marks thinking, and its budget when it asks for one (a budget
        follows every token in order, so such a request does not draft)."""
        seq.thinking = self.encoder.thinking(seq.prompt_ids)
        budget, ids = seq.sampling.thinking_budget, self.encoder.think_ids
        if seq.thinking is None or budget is None or ids is None:
            return
        seq.budget = ThinkingBudget(ids[0], ids[1], budget, seq.thinking.inside)
        seq.sampling = replace(seq.sampling, speculate=False)

    def _prefill(self, chunks: list[PrefillChunk]) -> None:
        try:
            if self.vision is not None:  # a bounded slice of images per step; chunks wait
                chunks = self.vision.encode_ahead(chunks, self.scheduler.config.prefill_chunk)
            firsts = self.runner.prefill(chunks) if chunks else []
        except (RuntimeError, ValueError, TypeError) as exc:  # MLX and model code fail so
            log.exception("prefill failed for %s", [c.seq.request_id for c in chunks])
            seqs = [c.seq for c in chunks]
            self.runner.remove(set(seqs))
            self._recover(seqs, exc, "prefill")
            return
        for chunk in chunks:
            self.scheduler.complete_chunk(chunk)
            if chunk.is_last and self.vision is not None:
                self.vision.done_with(chunk.seq)
        self._accept(firsts)  # a sequence done at its first token is retired at step end

    def _reserve(self) -> None:
        """Room in the KV pool for every row's next token; preempted rows leave the batch (their
        unread token is dropped: the recompute samples it again, with the same seed and index)."""
        preempted = self.scheduler.reserve_decode(self.runner.rows)
        if not preempted and self.runner.needs_room():
            # A runner with no pool keeps the batch's KV under its budget: unread tokens are
            # read first, so the victim's caches hold exactly its tokens but the last, and it
            # resumes from a snapshot of them (runners.native) rather than from scratch.
            self._accept(self.runner.sync())
            victim = self.scheduler.preempt_one()
            preempted = [victim] if victim is not None else []
        if preempted:
            log.info("preempted %s (KV pool full)", [s.request_id for s in preempted])
            self.runner.remove(set(preempted))

    def _decode(self, speculate: bool) -> None:
        """One decode step, verifying drafts when ``speculate`` and some row has any."""
        rows = list(self.runner.rows)
        try:
            drafts = self._drafts(rows) if speculate else []
            events = self.runner.verify_step(drafts) if any(drafts) else self.runner.decode_step()
        except (RuntimeError, ValueError, TypeError) as exc:
            log.exception("decode step failed")
            self._recover(self.runner.reset(), exc, "decode")
            return
        if any(drafts):
            for seq in rows:
                self.scheduler.trim(seq)  # rejected drafts' blocks
            kept = Counter(seq for seq, _ in events)
            self.speculator.on_verified(rows, drafts, [kept[s] for s in rows])
        self._step_succeeded()
        if (raised := self.oom_backoff.on_step(self.scheduler.config.max_num_seqs)) is not None:
            self.scheduler.update_config(max_num_seqs=raised)
            log.info(
                "max_num_seqs back to %d: no out-of-memory error in %d steps",
                raised,
                self.oom_backoff.wait,
            )
        self._accept(events)

    def _drafts(self, rows: list[Sequence]) -> list[list[int]]:
        """Each row's drafts, cut to what its grammar accepts and the KV room free blocks give."""
        proposed = [
            valid_drafts(s, d) for s, d in zip(rows, self.speculator.propose(rows), strict=True)
        ]
        return [
            d[: self.scheduler.reserve_drafts(s, len(d))] if d else []
            for s, d in zip(rows, proposed, strict=True)
        ]

    def _recover(self, seqs: list[Sequence], exc: Exception, what: str) -> None:
        """After a failed step: its sequences fail, unless the device ran out of memory. Then
        they wait to be computed again from their tokens (their streams pause, as after a
        preemption; at most ``OOM_RETRIES`` times each), with a batch half as large as the one
        that failed, so that one request too many costs a pause, not every stream."""
        if not any(word in str(exc).lower() for word in _OOM_WORDS):
            self._step_failed(what, exc)
            for seq in seqs:
                self._fail(seq, InternalError(f"{what} failed: {exc}"))
            return
        in_flight = len(self.scheduler.running) + len(self.scheduler.prefilling)
        limit = max(1, min(self.scheduler.config.max_num_seqs, in_flight // 2))
        if limit == self.scheduler.config.max_num_seqs:  # a smaller batch may fit: not failing
            self._step_failed(what, exc)
        self.oom_backoff.on_oom(self.scheduler.config.max_num_seqs, limit)
        self.scheduler.update_config(max_num_seqs=limit)
        log.warning(
            "out of device memory in %s: %d requests computed again, max_num_seqs now "
            "%d (raised again after %d clean steps)",
            what,
            len(seqs),
            limit,
            self.oom_backoff.wait,
        )
        for seq in seqs:
            if seq.num_oom_retries >= OOM_RETRIES:
                self._fail(seq, OutOfMemory(f"out of device memory ({what}): {exc}"))
                continue
            seq.num_oom_retries += 1
            self.scheduler.requeue(seq)
        self.runner.free_memory()

    def _step_failed(self, what: str, exc: Exception) -> None:
        self.num_failed_steps += 1
        if self.num_failed_steps >= MAX_FAILED_STEPS:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            self.failing = f"its last {self.num_failed_steps} steps failed ({what}: {first_line})"

    def _step_succeeded(self) -> None:
        self.num_failed_steps, self.failing = 0, ""

    def _accept(self, events: list[TokenEvent]) -> None:
        self.stats.on_tokens(events)
        now = self.clock()
        for seq, token in events:
            if seq.first_token_time is None:  # a resumed sequence had its first token before
                seq.first_token_time = now
            if not seq.is_finished:
                self._add_token(seq, token)

    def _add_token(self, seq: Sequence, token: int) -> None:
        p = seq.sampling
        seq.output_ids.append(token)
        if seq.budget is not None:
            seq.budget.follow(token)
        n = seq.num_output_tokens
        may_stop = n > p.min_tokens
        if may_stop and token in p.stop_token_ids:
            return self._finish(seq, "stop")
        if may_stop and not p.ignore_eos and token in self.encoder.eos_token_ids:
            return self._finish(seq, "stop")  # eos counts as a token but adds no text
        seq.text += seq.detok.add(token)
        if seq.detok.stopped and may_stop:
            return self._finish(seq, "stop")
        if n >= seq.max_tokens:
            return self._finish(seq, "length")
        if n - seq.num_sent_tokens >= self.scheduler.config.stream_interval:
            self._emit_delta(seq)

    def _emit_delta(self, seq: Sequence) -> None:
        ids = seq.output_ids[seq.num_sent_tokens :]
        if not ids and not seq.text:
            return
        prompt, thinking = None, None
        if seq.num_sent_tokens == 0:  # the first delta says what the prompt cost
            thinking = seq.thinking
            prompt = Usage(
                prompt_tokens=seq.num_prompt_tokens,
                completion_tokens=0,
                cached_tokens=seq.num_cached,
            )
        delta = TokenDelta(
            request_id=seq.request_id,
            text=seq.text,
            token_ids=ids,
            logprobs=self._logprobs(seq),
            prompt=prompt,
            thinking=thinking,
        )
        self._outbox.setdefault(seq.client, []).append(delta)
        seq.text = ""
        seq.num_sent_tokens = seq.num_output_tokens

    def _logprobs(self, seq: Sequence) -> list[TokenLogprob] | None:
        if not seq.sampling.logprobs:
            return None
        n = seq.num_output_tokens - seq.num_sent_tokens
        raw, seq.logprobs = seq.logprobs[:n], seq.logprobs[n:]
        tb = self.encoder.token_bytes
        return [
            TokenLogprob(
                token_id=t,
                token=tb(t),
                logprob=v,
                top_logprobs=[TopLogprob(token_id=a, token=tb(a), logprob=av) for a, av in top],
            )
            for t, v, top in raw
        ]

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.text += seq.detok.finish()
        self._emit_delta(seq)
        usage = Usage(
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached,
        )
        stop = seq.detok.matched_stop if reason == "stop" else None
        self._outbox.setdefault(seq.client, []).append(
            Finished(request_id=seq.request_id, finish_reason=reason, usage=usage, stop=stop)
        )
        self.scheduler.finish(seq, reason)
        self.stats.on_finish(seq, reason)
        self._step_succeeded()

    def _fail(self, seq: Sequence, exc: MlxdError) -> None:
        self._outbox.setdefault(seq.client, []).append(_error(seq.request_id, exc))
        self.scheduler.finish(seq, "error")
        self.stats.on_finish(seq, "error")

    def _send_error(self, client: bytes, request_id: str, exc: MlxdError) -> None:
        self.channel.send(client, _error(request_id, exc))

    def _expire(self) -> None:
        for seq in self.scheduler.expired():
            self._fail(seq, RequestTimeout("the request timed out"))

    def _retire(self) -> None:
        done = {s for s in self.runner.sequences() if s.is_finished}
        if done:
            self.runner.remove(done)
            self.speculator.forget()

    def _flush(self) -> None:
        for client, events in self._outbox.items():
            msg: Message = events[0] if len(events) == 1 else Events(events=events)
            self.channel.send(client, msg)
        self._outbox.clear()


def _error(request_id: str, exc: MlxdError) -> Error:
    retry_after = exc.retry_after if isinstance(exc, Overloaded) else None
    return Error(
        request_id=request_id,
        code=exc.code,
        message=exc.message,
        param=exc.param,
        retry_after_s=retry_after,
    )
