"""Every message that crosses a process boundary, as frozen dataclasses.

Each class has a wire ``TAG``. A frame set is ``[PROTOCOL_VERSION, msgpack({"type": TAG, ...})]``;
see docs/protocol.md. New features get new message types rather than optional fields on old ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = b"mlxd/9"  # mlxd/9: no MemoryUsage.cache_sweeps (mlxd/8 added it)


# Prompts: a tagged union, so the worker never guesses which field is set.


@dataclass(frozen=True, kw_only=True)
class ImageData:
    """One image of a chat, as the client sent it: the encoded file (PNG, JPEG...) and its
    content digest (hex), which keys its placeholder tokens in the prefix cache. Bytes, never a
    URL: the gateway fetched or decoded it."""

    data: bytes
    digest: str


@dataclass(frozen=True, kw_only=True)
class ChatPrompt:
    """A chat rendered by the worker with the model's chat template.

    ``messages`` are OpenAI-shaped dicts (role, content, and optionally name, tool_calls...).
    ``thinking`` is the template's thinking switch (``enable_thinking``): None leaves the
    template's default; a template without the switch ignores it. ``images``: each
    ``{"type": "image"}`` content part's image, in the order the parts appear.
    """

    TAG: ClassVar[str] = "chat"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    thinking: bool | None = None
    # The images of ``messages``' ``{"type": "image"}`` parts, in order (None: text only).
    images: list[ImageData] | None = None


@dataclass(frozen=True, kw_only=True)
class TextPrompt:
    """Raw text, tokenized as is (``/v1/completions``)."""

    TAG: ClassVar[str] = "text"
    text: str


@dataclass(frozen=True, kw_only=True)
class TokenPrompt:
    """Pre-tokenized input (``/v1/completions`` with a list of ints)."""

    TAG: ClassVar[str] = "tokens"
    token_ids: list[int]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True, kw_only=True)
class JsonFormat:
    """Constrain the output to JSON (``response_format``): any JSON object when ``schema`` is
    null, else a document valid against ``schema``, a JSON Schema given as JSON text."""

    schema: str | None = None


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples; every request in a batch has its own."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: bool = False  # report each output token's log probability
    top_logprobs: int = 0  # and this many most likely alternatives (0..20)
    response_format: JsonFormat | None = None  # enforced by constrained decoding
    speculate: bool = True  # False: never draft tokens for this request (docs/SPECULATION.md)
    # At most this many tokens inside thinking: then the worker samples the end marker (a model
    # whose marker is one token; max_tokens bounds the rest). None: no budget of its own.
    thinking_budget: int | None = None


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts of one finished request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


# Gateway -> worker (data plane)


@dataclass(frozen=True, kw_only=True)
class Generate:
    """Start one completion. The worker answers with TokenDelta* then Finished, or an Error."""

    TAG: ClassVar[str] = "generate"
    request_id: str
    prompt: Prompt
    sampling: SamplingParams
    priority: str = "normal"
    timeout_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Embed:
    """Embed each input (``/v1/embeddings``). The worker answers with one Embeddings, or an
    Error naming the first bad input (``param`` ``input[i]``)."""

    TAG: ClassVar[str] = "embed"
    request_id: str
    inputs: list[TextPrompt | TokenPrompt]


@dataclass(frozen=True, kw_only=True)
class CountTokens:
    """Count a prompt's tokens as a ``Generate`` would (chat template and tools applied),
    without running the model (``/v1/messages/count_tokens``). Answered with one TokenCount,
    or an Error (e.g. ``invalid_request`` when the template cannot render the prompt)."""

    TAG: ClassVar[str] = "count_tokens"
    request_id: str
    prompt: Prompt


@dataclass(frozen=True, kw_only=True)
class Cancel:
    """Stop a request (client gone, timeout, admin). The worker sends nothing more for it."""

    TAG: ClassVar[str] = "cancel"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class Ping:
    """Liveness probe; answered with a Pong carrying the same request_id."""

    TAG: ClassVar[str] = "ping"
    request_id: str


# Worker -> gateway


@dataclass(frozen=True, kw_only=True)
class Pong:
    """Answer to Ping: the worker is alive and says what it serves."""

    TAG: ClassVar[str] = "pong"
    request_id: str
    model: str
    max_context: int
    tool_parser: str | None = None  # mlx-lm's tool parser module for the model, if any
    # Seconds the engine thread has spent in its current loop iteration (one step) when the
    # control thread answered: a slow step is busy, not hung; only a stuck one grows without end.
    busy_s: float = 0.0
    # Why the engine is failing: its last steps all failed, none succeeded ("" while it works).
    # The supervisor marks such a model failed, as it does one that keeps crashing.
    failing: str = ""
    # What a worker warming up at load builds now (worker/warmup.py); "" once it serves.
    warming: str = ""


@dataclass(frozen=True, kw_only=True)
class TopLogprob:
    """One of the most likely tokens at a position: its id, exact bytes and log probability."""

    token_id: int
    token: bytes
    logprob: float


@dataclass(frozen=True, kw_only=True)
class TokenLogprob:
    """The log probability of one output token under the model's raw distribution (before
    temperature, penalties and constraints), with the ``top_logprobs`` most likely tokens."""

    token_id: int
    token: bytes  # exact bytes: a token may hold part of a UTF-8 character
    logprob: float
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Thinking:
    """How a model's output marks its thinking: the text that opens and closes it, and whether
    the output starts inside it (the rendered prompt opened it, so no opening tag comes)."""

    start: str
    end: str
    inside: bool = False


@dataclass(frozen=True, kw_only=True)
class TokenDelta:
    """New output of one request: the text that is now final and the token ids behind it.

    ``logprobs`` is set when the request asked for them: one entry per id in ``token_ids``.
    ``prompt`` is set on a request's first delta only: its prompt and cached tokens (and
    ``completion_tokens`` 0), so a stream can report them before it ends (Anthropic's
    ``message_start``). ``thinking`` is set on the first delta only, for a model whose
    tokenizer marks thinking (``None``: it does not; all output is the answer).
    """

    TAG: ClassVar[str] = "token_delta"
    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    prompt: Usage | None = None
    thinking: Thinking | None = None


@dataclass(frozen=True, kw_only=True)
class Finished:
    """The request is complete. ``finish_reason`` is "stop", "length" or "cancelled"; ``stop``
    is the stop string that ended it, if one did (Anthropic's ``stop_sequence``)."""

    TAG: ClassVar[str] = "finished"
    request_id: str
    finish_reason: str
    usage: Usage
    text: str = ""
    stop: str | None = None


@dataclass(frozen=True, kw_only=True)
class Error:
    """The request failed; the worker keeps running. ``code`` is an ``mlxd.errors`` code."""

    TAG: ClassVar[str] = "error"
    request_id: str
    code: str
    message: str
    param: str | None = None
    retry_after_s: float | None = None  # with "overloaded": from the queue's drain rate


@dataclass(frozen=True, kw_only=True)
class Embeddings:
    """Answer to Embed: one unit vector per input, in input order, each as little-endian float32
    bytes (``dimensions`` floats); ``usage.prompt_tokens`` counts every input token."""

    TAG: ClassVar[str] = "embeddings"
    request_id: str
    dimensions: int
    embeddings: list[bytes]
    usage: Usage


@dataclass(frozen=True, kw_only=True)
class TokenCount:
    """Answer to CountTokens: the prompt's length in tokens."""

    TAG: ClassVar[str] = "token_count"
    request_id: str
    num_tokens: int


Event = TokenDelta | Finished | Error


@dataclass(frozen=True, kw_only=True)
class Events:
    """Several events in one frame: the worker coalesces a decode step's output per client."""

    TAG: ClassVar[str] = "events"
    events: list[Event]


# Admin -> worker (control plane: a second ROUTER per worker; see docs/protocol.md)


@dataclass(frozen=True, kw_only=True)
class GetStatus:
    """What the worker serves and how it is doing now; answered with a StatusReply."""

    TAG: ClassVar[str] = "get_status"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class GetStats:
    """Request counters, throughput and latency percentiles; answered with a StatsReply."""

    TAG: ClassVar[str] = "get_stats"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class Drain:
    """Finish running and waiting requests, refuse new ones (``worker_unavailable``). Ack."""

    TAG: ClassVar[str] = "drain"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class Pause:
    """Stop running steps; requests stay queued and new ones are still accepted. Ack."""

    TAG: ClassVar[str] = "pause"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class Resume:
    """Undo Pause and Drain: schedule steps and accept requests again. Ack."""

    TAG: ClassVar[str] = "resume"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class FlushCache:
    """Free MLX's buffer cache (and later the prefix cache). Ack."""

    TAG: ClassVar[str] = "flush_cache"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class SetConfig:
    """Change scheduler knobs live; unset (null) fields keep their value. Ack, or an Error
    (``invalid_request``, ``param`` = the field) when a value is out of range."""

    TAG: ClassVar[str] = "set_config"
    request_id: str
    max_num_seqs: int | None = None
    max_queued: int | None = None
    prefill_chunk: int | None = None
    stream_interval: int | None = None
    aging_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    """Drain, then exit with code 0. Ack (sent before the drain completes)."""

    TAG: ClassVar[str] = "shutdown"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class DebugCrash:
    """Test-only: the worker calls ``os.abort()`` (a native crash, no cleanup, no reply).

    Workers refuse it with ``protocol_error`` unless started with ``MLXD_TEST_FAULTS=1``
    (``mlxd worker serve --enable-test-faults``), so fault tests can crash a worker on demand.
    """

    TAG: ClassVar[str] = "debug_crash"
    request_id: str


@dataclass(frozen=True, kw_only=True)
class DebugSleep:
    """Test-only: the engine thread blocks for ``seconds``, then acks, as a step that takes long
    (first CUDA kernel compiles, a huge prefill chunk) or a stuck one would.

    Refused like ``DebugCrash`` unless the worker runs with test faults enabled.
    """

    TAG: ClassVar[str] = "debug_sleep"
    request_id: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class DebugFailSteps:
    """Test-only: from now on every model forward raises ``RuntimeError(message)``, as a
    broken device or model would, so every step fails while the worker stays up. Acked.

    Refused like ``DebugCrash`` unless the worker runs with test faults enabled.
    """

    TAG: ClassVar[str] = "debug_fail_steps"
    request_id: str
    message: str


# Worker -> admin


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """The scheduler knobs in force (``SchedulerConfig``)."""

    max_num_seqs: int
    max_queued: int
    prefill_chunk: int
    stream_interval: int
    aging_s: float
    speculate: str = "auto"  # "auto", "ngram", "draft" or "off"
    draft_model: str | None = None  # what drafts with "draft"
    warmup_s: float | None = None  # the warm-up's bound at load (0: none; None: by device)


@dataclass(frozen=True, kw_only=True)
class MemoryUsage:
    """Bytes: model weights, KV held by requests in flight (with the paged cache: their blocks),
    KV memory reserved now and the KV budget (the paged pool grows in chunks up to it and
    shrinks when idle), MLX active/peak/cached buffers."""

    weights_bytes: int
    kv_bytes: int
    active_bytes: int
    peak_bytes: int
    cache_bytes: int
    cache_limit_bytes: int | None = None  # the cap on ``cache_bytes`` (None: MLX's default)
    kv_reserved_bytes: int = 0  # KV memory held now, used or not (the pool grows and shrinks)
    kv_budget_bytes: int = 0  # the most KV memory the worker may hold (0: no cap of its own)


@dataclass(frozen=True, kw_only=True)
class ComputeInfo:
    """How the worker computes: ``device`` "cpu" or "gpu"; ``blas`` the optimized BLAS it loaded
    ("" for none: MLX's bundled reference BLAS on the CPU); ``dtype`` the weights' float dtype
    as served and ``file_dtype`` as loaded (they differ when cast, e.g. float16 -> float32 on
    the CPU); ``gemm_gflops`` a matrix-product probe of ``gemm_size`` squared in ``dtype``, run
    at start."""

    device: str
    blas: str
    dtype: str
    file_dtype: str
    gemm_gflops: float
    gemm_size: int


@dataclass(frozen=True, kw_only=True)
class StatusReply:
    """Answer to GetStatus. ``state`` is "running", "paused" or "draining"."""

    TAG: ClassVar[str] = "status_reply"
    request_id: str
    model: str
    model_path: str
    state: str
    pid: int
    uptime_s: float
    max_context: int
    num_running: int
    num_waiting: int
    num_prefilling: int
    memory: MemoryUsage
    scheduler: SchedulerSettings
    kv_cache: str = ""  # how KV is kept: "paged: N blocks of B tokens (...)" or "contiguous ..."
    compute: ComputeInfo | None = None  # None from a worker that does not report it


@dataclass(frozen=True, kw_only=True)
class LatencySummary:
    """Percentiles in milliseconds over the most recent ``num_samples`` samples (0 if none)."""

    num_samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True, kw_only=True)
class StatsReply:
    """Answer to GetStats: counters since the worker started, recent throughput and latency."""

    TAG: ClassVar[str] = "stats_reply"
    request_id: str
    uptime_s: float
    requests_admitted: int
    requests_finished: int
    requests_cancelled: int
    requests_errored: int
    requests_rejected: int
    prompt_tokens: int
    output_tokens: int
    output_tps_recent: float
    output_tps_total: float
    ttft: LatencySummary
    itl: LatencySummary
    preemptions: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_misses: int = 0
    kv_block_size: int = 0  # 0: the contiguous cache (no blocks)
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0  # referenced by a sequence or the prefix cache
    kv_blocks_free: int = 0
    kv_blocks_cached: int = 0  # indexed by the prefix cache (some may be in use too)
    decode_steps: int = 0
    decode_step: LatencySummary = LatencySummary(num_samples=0, p50_ms=0.0, p95_ms=0.0, p99_ms=0.0)
    decode_rows_mean: float = 0.0  # rows per decode step, over the samples of ``decode_step``
    decode_gathered_steps: int = 0  # decode steps that read the pool's blocks: the view was full
    speculation: str = "off"  # --speculate in force ("off" too for a runner that cannot)
    spec_drafted_tokens: int = 0  # draft tokens verified since the worker started
    spec_accepted_tokens: int = 0  # of those, accepted
    spec_acceptance_rate: float = 0.0  # accepted / drafted
    tokens_per_forward: float = 0.0  # decode tokens per row and forward (1.0: no speculation)
    decode_row_forwards: int = 0  # rows x decode forwards since start (tokens_per_forward's base)
    images: int = 0  # images in admitted requests (a VLM)
    images_encoded: int = 0  # images through the vision tower (none on a prefix hit; a resumed
    # preempted request may run it again)
    vision_encode_s: float = 0.0  # seconds the vision tower ran, on the engine thread
    images_per_s_recent: float = 0.0  # images admitted per second, over the last 10 s


@dataclass(frozen=True, kw_only=True)
class Ack:
    """A control command was applied. ``state`` is the worker's state after it."""

    TAG: ClassVar[str] = "ack"
    request_id: str
    state: str
    message: str = ""


ControlRequest = (
    Ping
    | GetStatus
    | GetStats
    | Drain
    | Pause
    | Resume
    | FlushCache
    | SetConfig
    | Shutdown
    | DebugCrash
    | DebugSleep
    | DebugFailSteps
)
ControlReply = Pong | StatusReply | StatsReply | Ack | Error

Message = (
    Generate
    | Cancel
    | Ping
    | Pong
    | TokenDelta
    | Finished
    | Error
    | Events
    | Embed
    | Embeddings
    | CountTokens
    | TokenCount
    | GetStatus
    | GetStats
    | Drain
    | Pause
    | Resume
    | FlushCache
    | SetConfig
    | Shutdown
    | DebugCrash
    | DebugSleep
    | DebugFailSteps
    | StatusReply
    | StatsReply
    | Ack
)

MESSAGE_TYPES: tuple[type, ...] = (
    Generate,
    Cancel,
    Ping,
    Pong,
    TokenDelta,
    Finished,
    Error,
    Events,
    Embed,
    Embeddings,
    CountTokens,
    TokenCount,
    GetStatus,
    GetStats,
    Drain,
    Pause,
    Resume,
    FlushCache,
    SetConfig,
    Shutdown,
    DebugCrash,
    DebugSleep,
    DebugFailSteps,
    StatusReply,
    StatsReply,
    Ack,
)
