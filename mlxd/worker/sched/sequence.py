"""Per-request state in the worker. State only: policy lives in the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from mlxd.knobs import PRIORITIES
from mlxd.protocol.messages import SamplingParams

PRIORITY_LEVELS = {name: level for level, name in enumerate(PRIORITIES)}  # 0 runs first


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request being served: its prompt, its output so far and where it stands.

    ``client`` is the ZMQ identity of the gateway connection that asked for it; every event for
    this request goes back there.
    """

    request_id: str
    client: bytes
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    priority: int = PRIORITY_LEVELS["normal"]
    arrival: float = 0.0
    deadline: float | None = None
    seed: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_prefilled: int = 0  # tokens of ``prefill_ids`` whose K/V is computed or was cached
    num_cached: int = 0  # prompt tokens found in the prefix cache (reported as cached_tokens)
    # Paged KV: the sequence's blocks (logical -> physical), how many tokens have K/V there,
    # the prefix-cache node it locked, and how many output tokens a recompute prefills again
    # after a preemption.
    block_ids: list[int] = field(default_factory=list)
    # A sliding-window model's window layers: the slab of each block, -1 once behind the window
    # (window_slabs.py).
    window_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    prefix_node: Any = None
    num_resumed: int = 0
    num_preemptions: int = 0
    num_oom_retries: int = 0  # times computed again after the device ran out of memory
    # A hybrid's recurrent state (runners.hybrid):
    # the state the prefix hit restores (None: none, prefill starts from nothing), block
    # boundaries where prefill must keep one (where the prompt stops sharing blocks with the
    # prefix cache or with a prompt waiting on it), and the states taken but not yet handed to
    # the prefix cache, by the tokens they follow.
    state_hit: Any = None
    snapshot_at: set[int] = field(default_factory=set)
    states: dict[int, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    detok: Any = None
    text: str = ""
    num_sent_tokens: int = 0
    first_token_time: float | None = None
    # (token id, logprob, top alternatives) per output token not sent yet, if the request asks
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    grammar: Any = None  # a grammar.Grammar when the output must match a response_format
    thinking: Any = None  # messages.Thinking: how the output marks thinking (the first delta's)
    budget: Any = None  # a thinking.ThinkingBudget when the request caps its thinking
    # A VLM prompt's images (vision.encoder.PromptImages) and its prefix-cache keys: its ids
    # with each image's placeholders keyed by the image's digest (None: the ids themselves).
    images: Any = None
    prompt_keys: list[int] | None = None

    @property
    def image_spans(self) -> list[tuple[int, int]]:
        """The prompt's images whose tokens attend each other both ways, each ``[start, end)``
        (``sched.image_spans``); none for a causal model's."""
        return [] if self.images is None else self.images.spans

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """What prefill runs: the prompt, plus the output so far when resuming a preempted one."""
        if not self.num_resumed:
            return self.prompt_ids
        return self.prompt_ids + self.output_ids[: self.num_resumed]

    @property
    def prefill_keys(self) -> list[int]:
        """``prefill_ids`` as the prefix cache keys them (an image's placeholders by its digest)."""
        if self.prompt_keys is None:
            return self.prefill_ids
        return self.prompt_keys + self.output_ids[: self.num_resumed]

    @property
    def known_keys(self) -> list[int]:
        """The prompt and the output so far, as the prefix cache keys them."""
        prompt = self.prompt_ids if self.prompt_keys is None else self.prompt_keys
        return prompt + self.output_ids

    @property
    def num_prefill_tokens(self) -> int:
        return len(self.prompt_ids) + self.num_resumed

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
