"""An in-process worker engine on the tiny model, driven over a real ZMQ socket.

The test thread steps the engine itself (instead of ``Engine.run``), so the order in which
requests meet the scheduler is exact and tests are deterministic.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import zmq

from mlxd.config import SchedulerConfig
from mlxd.protocol import codec
from mlxd.protocol.channel import WorkerChannel
from mlxd.protocol.messages import (
    Embed,
    Embeddings,
    Error,
    Events,
    Finished,
    Generate,
    Message,
    SamplingParams,
    TextPrompt,
    Thinking,
    TokenDelta,
    TokenLogprob,
    TokenPrompt,
)


@cache
def load_model(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(path))[:2]  # type: ignore[return-value]


@dataclass
class Result:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: Finished | None = None
    error: Error | None = None
    steps_to_first_token: int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    embeddings: Embeddings | None = None
    steps_to_embeddings: int | None = None
    thinking: Thinking | None = None  # the first delta's


class Harness:
    """A real Engine on a real ROUTER, a DEALER for the test, and the results per request."""

    def __init__(
        self,
        model_path: Path,
        clock: Any = None,
        paged: bool = True,
        num_blocks: int = 256,
        block_size: int = 16,
        max_view_tokens: int | None = None,
        chunk_blocks: int | None = None,
        kv_format: Any = None,
        state_budget: int = 1 << 30,
        **sched: Any,
    ) -> None:
        from mlxd.worker.build import fit_kv
        from mlxd.worker.embedder import Embedder
        from mlxd.worker.engine import Engine
        from mlxd.worker.kv import layer_caches
        from mlxd.worker.kv.block_pool import BlockPool
        from mlxd.worker.kv.paged_cache import KVPool
        from mlxd.worker.main import model_vocab_size
        from mlxd.worker.prefix.snapshot_cache import SnapshotCache
        from mlxd.worker.runners.base import ModelRunner
        from mlxd.worker.runners.contiguous import ContiguousModelRunner
        from mlxd.worker.runners.hybrid import HybridModelRunner
        from mlxd.worker.runners.native import NativeModelRunner
        from mlxd.worker.runners.paged import PagedModelRunner, check_model_supported
        from mlxd.worker.runners.served import for_serving
        from mlxd.worker.runners.window import WindowModelRunner
        from mlxd.worker.sampling.tokenizer import PromptEncoder
        from mlxd.worker.sched.scheduler import Scheduler

        model, tokenizer = load_model(model_path)
        for_serving(model)  # as the worker serves it (mlx-lm reads the last position too)
        encoder = PromptEncoder(tokenizer, vocab_size=model_vocab_size(model, tokenizer))
        native = check_model_supported(model)  # the pool cannot hold it: its own caches
        hybrid = bool(native) and paged and layer_caches.is_hybrid(model)  # as the worker
        window = layer_caches.window_size(model) if native and paged and not hybrid else 0
        pool = BlockPool(num_blocks, block_size) if paged and (hybrid or not native) else None
        runner: ModelRunner
        if window:  # ``num_blocks`` of every layer's K/V: the budget both pools share
            runner, pool = WindowModelRunner.for_model(
                model,
                encoder.eos_token_ids,
                num_blocks,
                block_size,
                window,
                None if chunk_blocks is None else chunk_blocks * block_size * 1024,
                kv_format,
                max_view_tokens,
            )
        elif hybrid:
            runner = HybridModelRunner(
                model,
                encoder.eos_token_ids,
                KVPool.for_model(model, num_blocks, block_size, chunk_blocks, kv_format),
                state_budget,
                max_view_tokens,
            )
        elif native:  # ``paged``: with the snapshot prefix cache, as the worker serves it
            snapshots = SnapshotCache(1 << 30) if paged else None
            runner = NativeModelRunner(model, encoder.eos_token_ids, snapshots, block_size, native)
        elif paged:
            runner = PagedModelRunner(
                model,
                encoder.eos_token_ids,
                KVPool.for_model(model, num_blocks, block_size, chunk_blocks, kv_format),
                max_view_tokens,
            )
        else:
            runner = ContiguousModelRunner(model, encoder.eos_token_ids)
        # Tests of decode's mechanics count plain steps; speculation's own tests turn it on.
        sched.setdefault("speculate", "off")
        drafter = None
        if sched.get("draft_model"):  # loaded as the worker loads it (worker/main.py)
            from mlxd.worker.spec.draft_model import DraftModel

            draft, _ = load_model(Path(sched["draft_model"]))
            for_serving(draft)
            drafter = DraftModel(
                draft, draft.args.vocab_size, model.args.vocab_size, sched["draft_model"]
            )
        self.ctx = zmq.Context()
        endpoint = f"inproc://{uuid.uuid4().hex}"
        self.channel = WorkerChannel(endpoint, context=self.ctx)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(endpoint)
        self.engine = Engine(
            name="tiny",
            runner=runner,
            scheduler=Scheduler(
                SchedulerConfig(**sched), pool=pool, **({"clock": clock} if clock else {})
            ),
            encoder=encoder,
            channel=self.channel,
            max_context=min(512, num_blocks * block_size),
            embedder=Embedder(model),
            drafter=drafter,
        )
        fit_kv(self.engine.scheduler, runner)
        self.results: dict[str, Result] = {}
        self.steps = 0

    def send(self, msg: Message) -> None:
        self.dealer.send_multipart(codec.encode(msg))
        for client, incoming in self.channel.recv_ready(timeout_ms=1000):
            self.engine.dispatch(client, incoming)
        self._drain()

    def generate(self, rid: str, prompt: str, **sampling: Any) -> None:
        sampling.setdefault("temperature", 0.0)
        self.results[rid] = Result()
        self.send(
            Generate(
                request_id=rid, prompt=TextPrompt(text=prompt), sampling=SamplingParams(**sampling)
            )
        )

    def generate_ids(self, rid: str, ids: list[int], **sampling: Any) -> None:
        sampling.setdefault("temperature", 0.0)
        self.results.setdefault(rid, Result())
        self.send(
            Generate(
                request_id=rid,
                prompt=TokenPrompt(token_ids=ids),
                sampling=SamplingParams(**sampling),
            )
        )

    def run_alone(self, rid: str, ids: list[int], max_tokens: int = 12) -> Result:
        """One greedy request of ``ids`` (EOS ignored), run to its end: its result."""
        self.results[rid] = Result()
        self.generate_ids(rid, ids, max_tokens=max_tokens, ignore_eos=True)
        return self.run()[rid]

    def run_together(self, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
        """Greedy requests of each of ``prompts`` (EOS ignored), all sent at once and run to
        their ends: each one's token ids."""
        for i, ids in enumerate(prompts):
            self.generate_ids(f"r{i}", ids, max_tokens=max_tokens, ignore_eos=True)
        results = self.run()
        return [results[f"r{i}"].token_ids for i in range(len(prompts))]

    def embed(self, rid: str, texts: list[str]) -> None:
        self.results[rid] = Result()
        self.send(Embed(request_id=rid, inputs=[TextPrompt(text=t) for t in texts]))

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.engine.step()
            self.engine.scheduler.check_invariants()
            self.steps += 1
            self._drain()

    def run(self, max_steps: int = 2000) -> dict[str, Result]:
        while self.engine.scheduler.has_work() and max_steps:
            self.step()
            max_steps -= 1
        assert not self.engine.scheduler.has_work(), "engine did not finish"
        return self.results

    def close(self) -> None:
        self.dealer.close(linger=0)
        self.channel.close()
        self.ctx.term()

    def _drain(self) -> None:
        while self.dealer.poll(0):
            self._record(codec.decode(self.dealer.recv_multipart()))

    def _record(self, msg: Message) -> None:
        if isinstance(msg, Events):
            for event in msg.events:
                self._record(event)
            return
        res = self.results.setdefault(getattr(msg, "request_id", ""), Result())
        if isinstance(msg, TokenDelta):
            if res.steps_to_first_token is None:
                res.steps_to_first_token = self.steps
                res.thinking = msg.thinking
            res.text += msg.text
            res.token_ids += msg.token_ids
            res.logprobs += msg.logprobs or []
        elif isinstance(msg, Finished):
            res.finished = msg
        elif isinstance(msg, Error):
            res.error = msg
        elif isinstance(msg, Embeddings):
            res.embeddings = msg
            res.steps_to_embeddings = self.steps


@contextlib.contextmanager
def harnesses(model_path: Path) -> Iterator[Callable[..., Harness]]:
    """A maker of harnesses on ``model_path`` (keyword arguments: ``Harness``'s), each closed
    when the block ends."""
    made: list[Harness] = []

    def make(**kw: Any) -> Harness:
        made.append(Harness(model_path, **kw))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.close()


@pytest.fixture
def harness_factory(tiny_model: Path) -> Iterator[Callable[..., Harness]]:
    with harnesses(tiny_model) as make:
        yield make
