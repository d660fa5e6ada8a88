"""Frozen configuration values. Each constructor takes the narrowest piece it needs.

Validation raises ``ConfigError`` (the CLI prints it and exits 2); never ``assert``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mlxd import backend_knobs, model_knobs
from mlxd.backend_knobs import BACKEND_KNOBS, backend_rule
from mlxd.errors import ConfigError
from mlxd.knobs import (
    AGING_S,
    BLOCK_SIZE,
    DRAFT_MODEL,
    DTYPE,
    KV_BITS,
    KV_CACHE_GB,
    KV_CHUNK_MB,
    KV_DISK_GB,
    KV_GROUP_SIZE,
    KV_IDLE_S,
    MAX_CONTEXT,
    MAX_IMAGE_PIXELS,
    MAX_NUM_SEQS,
    MAX_QUEUED,
    PAGED,
    PREFILL_CHUNK,
    PRIORITIES,
    SPECULATE,
    STREAM_INTERVAL,
    WARMUP_S,
    Knob,
    given,
    section,
)
from mlxd.model_knobs import GROUP_KNOBS, MODEL_KNOBS, model_rule
from mlxd.serve_knobs import (
    ADMIN_KEY,
    ALLOW_PRIVATE_IMAGE_URLS,
    CHAT_TIMEOUT,
    COMPLETION_TIMEOUT,
    CRASH_WINDOW,
    DRAIN_TIMEOUT,
    EMBEDDINGS_TIMEOUT,
    HEARTBEAT_TIMEOUT,
    HOST,
    IMAGE_FETCH_TIMEOUT,
    KEEP_ALIVE,
    LOG_PROMPTS,
    MAX_BODY_BYTES,
    MAX_CRASHES,
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    MAX_MEMORY,
    MAX_STORED_RESPONSES,
    OLLAMA_PORT,
    PORT,
    REQUEST_LOG,
    REQUEST_LOG_SIZE,
    RESTART_BACKOFF,
    ROUTING,
    SERVE_KNOBS,
    STEP_TIMEOUT,
    STORED_RESPONSES_SIZE,
    STREAM_STALL_TIMEOUT,
)

if TYPE_CHECKING:
    from mlxd.protocol.curve import CurveKeys

DEFAULT_MODEL = "mlxd-default"
API_KEY_TIERS = PRIORITIES  # a key's tier is the highest priority its requests get
# Of a paged worker's KV budget, the share decode's read view may hold (a copy of the batch's
# K/V that makes each step read one contiguous array; see worker/kv/decode_tail.py); the pool
# gets the rest, so the budget caps both.
VIEW_SHARE = 0.2
# Of a hybrid model's KV budget, the share its prefix cache's recurrent-state snapshots may hold
# (worker/runners/hybrid.py); the pool and the view split the rest.
STATE_SHARE = 0.25
# ... of its budget at most, and of what the pool holds at the moment beside it (the snapshots
# follow the load, as the pool does), but never less than this many bytes.
STATE_FLOOR = 2**30


def split_kv_budget(budget: int, per_token: int, block_size: int) -> tuple[int, int]:
    """A paged worker's KV ``budget`` (bytes) as (pool blocks, tokens decode's view may hold):
    ``VIEW_SHARE`` to the view, the rest to blocks of ``block_size`` tokens."""
    view_bytes = int(budget * VIEW_SHARE)
    return (budget - view_bytes) // (per_token * block_size), view_bytes // per_token


def kv_bytes_wanted(per_token: int, max_num_seqs: int, context: int, paged: bool) -> int:
    """The KV memory ``max_num_seqs`` full contexts take, ``per_token`` bytes a token; a paged
    worker also holds decode's view (``VIEW_SHARE`` of its budget). The one sizing rule of the
    daemon's footprint and the worker's pool, so the two agree."""
    wanted = per_token * max_num_seqs * context
    return int(wanted / (1 - VIEW_SHARE)) if paged else wanted


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where mlxd keeps made models, pidfiles and logs: $MLXD_HOME or ~/.local/share/mlxd."""
    env = os.environ if environ is None else environ
    if env.get("MLXD_HOME"):
        return Path(env["MLXD_HOME"]).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mlxd"


REQUEST_LOG_MAX_BYTES: int = REQUEST_LOG_SIZE.default  # --request-log-size


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Admission, batching and priority knobs of one worker."""

    max_num_seqs: int = MAX_NUM_SEQS.default
    max_queued: int = MAX_QUEUED.default
    prefill_chunk: int = PREFILL_CHUNK.default
    stream_interval: int = STREAM_INTERVAL.default
    aging_s: float = AGING_S.default
    speculate: str = SPECULATE.default  # "auto", "ngram", "draft" or "off" (docs/SPECULATION.md)
    draft_model: str | None = DRAFT_MODEL.default  # what proposes drafts with speculate "draft"
    # the warm-up's bound at load (worker/warmup.py; 0: none; None: by device)
    warmup_s: float | None = WARMUP_S.default

    def __post_init__(self) -> None:
        _check_knobs(self, section("scheduler"))
        if (self.speculate == "draft") != (self.draft_model is not None):
            raise ConfigError("--speculate draft and --draft-model PATH go together")

    @classmethod
    def from_options(
        cls, options: Mapping[str, object], file: Mapping[str, object] | None = None
    ) -> SchedulerConfig:
        """The scheduler knobs set in ``options`` or ``file`` (see ``knobs.given``)."""
        return cls(**given(section("scheduler"), options, file or {}))


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The worker's KV memory: a pool of ``block_size``-token blocks, ``kv_cache_gb`` big
    (None: a default share of memory), or the contiguous per-batch cache when not ``paged``."""

    kv_cache_gb: float | None = KV_CACHE_GB.default
    block_size: int = BLOCK_SIZE.default
    paged: bool = PAGED.default
    kv_chunk_mb: float = KV_CHUNK_MB.default  # the pool starts with and grows by this much
    kv_idle_s: float = KV_IDLE_S.default  # idle seconds before KV memory is given back (0: never)
    kv_disk_gb: float = KV_DISK_GB.default  # evicted prefix blocks kept on disk (0: none)
    kv_bits: int | None = KV_BITS.default  # the pool stores K/V quantized (None: float)
    kv_group_size: int = KV_GROUP_SIZE.default  # head_dim values per scale with kv_bits

    def __post_init__(self) -> None:
        _check_knobs(self, section("cache"))

    @classmethod
    def from_options(
        cls, options: Mapping[str, object], file: Mapping[str, object] | None = None
    ) -> CacheConfig:
        """The cache knobs set in ``options`` or ``file`` (see ``knobs.given``)."""
        return cls(**given(section("cache"), options, file or {}))


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One worker process: which model, where it listens, how it schedules."""

    model: str
    name: str
    endpoint: str
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    max_context: int | None = MAX_CONTEXT.default
    parent_pid: int | None = None
    reason_file: str | None = None  # where a startup failure's one-line reason is written
    control_endpoint: str | None = None  # None: derived from ``endpoint`` (w0.ctl.sock)
    enable_test_faults: bool = False  # accept DebugCrash on the control socket (tests only)
    buffer_cache_bytes: int | None = None  # cap on MLX's cache of freed buffers (None: default)
    curve_keys: CurveKeys | None = None  # required for tcp:// endpoints (mlxd.protocol.curve)
    dtype: str = DTYPE.default  # one of DTYPES
    max_image_pixels: int = MAX_IMAGE_PIXELS.default  # a VLM refuses larger images (400)
    # Processes serving the model over mlx.distributed (worker/group.py: rank 0 starts the
    # others on this host) and their backend (DISTRIBUTED_BACKENDS): its model's knobs, as
    # the daemon placed it (daemon/placement.py).
    group_size: int = 1
    distributed: str = "ring"

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a worker needs a model")
        _check_knobs(self, section("worker"))
        for knob in GROUP_KNOBS:
            knob.check(getattr(self, knob.field), f"worker: {knob.toml}")
        for endpoint in (self.endpoint, self.control_endpoint or self.endpoint):
            if not endpoint.startswith(("ipc://", "tcp://", "inproc://")):
                raise ConfigError(f"bad worker endpoint {endpoint!r}")
            if endpoint.startswith("tcp://") and self.curve_keys is None:
                raise ConfigError(
                    f"{endpoint}: tcp:// workers need CURVE keys; make them with "
                    "`mlxd keys new worker`"
                )
        if self.buffer_cache_bytes is not None and self.buffer_cache_bytes < 0:
            raise ConfigError("--buffer-cache-gb must be >= 0")

    def to_json(self) -> str:
        """This config as one JSON object: how the supervisor hands a spawned worker its whole
        config (`mlxd worker serve --config-json`) instead of an option per knob. CURVE keys
        stay out (secrets in no argv); a tcp:// worker loads its own."""
        return json.dumps(dataclasses.asdict(dataclasses.replace(self, curve_keys=None)))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """The config ``to_json`` wrote; ``ConfigError`` for anything else."""
        try:
            raw = json.loads(text)
            scheduler = SchedulerConfig(**raw.pop("scheduler", {}))
            cache = CacheConfig(**raw.pop("cache", {}))
            return cls(**raw, scheduler=scheduler, cache=cache)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"bad worker config JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model the daemon serves: the name clients use and what mlx-lm loads.

    ``aliases`` are more names for it. ``keep_alive_s``: seconds idle before its worker is
    unloaded (``0`` = never; ``None``: the daemon's ``--keep-alive``). ``pinned`` models are
    never unloaded to make room; ``preload`` ones start with the daemon, the others on their
    first request. ``kv_cache_gb`` sizes its KV cache in the memory budget. With ``endpoint``
    the worker already runs elsewhere (`mlxd worker serve --bind tcp://…`) and is attached,
    not spawned: it is pinged, never restarted, unloaded or counted in the budget. ``gpus``:
    the host's GPUs its workers run on, its replicas taking ``group_size`` of them in turn.

    Its settings are the knobs of model_knobs.py: their defaults and ranges come from there.
    """

    name: str
    path: str
    aliases: tuple[str, ...] = model_knobs.ALIASES.default
    keep_alive_s: float | None = model_knobs.KEEP_ALIVE.default
    pinned: bool = model_knobs.PINNED.default
    preload: bool = model_knobs.PRELOAD.default
    kv_cache_gb: float | None = model_knobs.KV_CACHE_GB.default
    endpoint: str | None = None
    dtype: str | None = model_knobs.DTYPE.default  # one of DTYPES; None: the daemon's --dtype
    fallbacks: tuple[str, ...] = model_knobs.FALLBACKS.default  # tried when it is unavailable
    fallback_on_busy: bool = model_knobs.FALLBACK_ON_BUSY.default  # its 429 goes to them too
    replicas: int = model_knobs.REPLICAS.default  # local workers serving it; routed by prefix
    replica_endpoints: tuple[str, ...] = ()  # more attached workers of it (--worker NAME= again)
    # Processes per worker (mlx.distributed) and their backend; None: as placed
    # (daemon/placement.py: 1 unless it needs a group of GPUs; nccl on CUDA GPUs, else ring).
    group_size: int | None = model_knobs.GROUP_SIZE.default
    distributed: str | None = model_knobs.DISTRIBUTED.default
    gpus: tuple[str, ...] = model_knobs.GPUS.default  # where its workers run ((): in turn)

    def __post_init__(self) -> None:
        if not self.name or not self.path:
            raise ConfigError("every model needs a name and a path or repo id")
        if self.replica_endpoints and self.endpoint is None:
            raise ConfigError(f"model {self.name!r}: replica endpoints need a first --worker")
        for knob in MODEL_KNOBS:
            model_rule(knob, getattr(self, knob.field), self.name)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The attached workers' endpoints, one per replica (empty: spawned here)."""
        return () if self.endpoint is None else (self.endpoint, *self.replica_endpoints)

    @property
    def num_replicas(self) -> int:
        """How many workers serve it: one per attached endpoint, else ``replicas``."""
        return len(self.endpoints) or self.replicas


BACKEND_KINDS = ("openai", "anthropic")

RESERVED_BACKEND_NAMES = ("ollama", "local")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A remote HTTP API that models can be routed to (``[backends.NAME]``).

    ``api_key_env`` names the environment variable holding the key, so the key itself is in no
    file, argv or repr; ``api_key`` reads it when the gateway starts. ``timeout_s``: longest
    silence from the upstream (connect included) before the request fails with 504 (or fails
    over). ``max_concurrency``: requests sent at once; more wait in line, by priority.
    ``headers``: extra request headers (e.g. an organization id). After ``breaker_failures``
    failures in a row nothing is sent for ``breaker_cooldown_s``, then one probe. These four
    are the knobs of backend_knobs.py: their defaults and ranges come from there.
    """

    name: str
    kind: str
    base_url: str
    api_key_env: str | None = None
    timeout_s: float = backend_knobs.TIMEOUT.default
    max_concurrency: int | None = backend_knobs.MAX_CONCURRENCY.default
    headers: tuple[tuple[str, str], ...] = ()
    breaker_failures: int = backend_knobs.BREAKER_FAILURES.default
    breaker_cooldown_s: float = backend_knobs.BREAKER_COOLDOWN.default

    def __post_init__(self) -> None:
        where = f"backend {self.name!r}"
        if not self.name or ":" in self.name or "=" in self.name:
            raise ConfigError(f"{where}: a backend name must be non-empty, without ':' or '='")
        if self.name in RESERVED_BACKEND_NAMES:  # `--model NAME=ollama:TAG` is a local model
            raise ConfigError(f"{where}: that name is taken by a model source; choose another")
        if self.kind not in BACKEND_KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(BACKEND_KINDS)}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: base_url must start with http:// or https://")
        for knob in BACKEND_KNOBS:
            backend_rule(knob, getattr(self, knob.field), self.name)

    def api_key(self, environ: Mapping[str, str]) -> str | None:
        """The key from ``environ[api_key_env]``; ``ConfigError`` if that variable is unset."""
        if self.api_key_env is None:
            return None
        key = environ.get(self.api_key_env, "")
        if not key:
            raise ConfigError(
                f"backend {self.name!r}: the environment variable "
                f"{self.api_key_env} (api_key_env) is not set"
            )
        return key


@dataclass(frozen=True, slots=True)
class RemoteModelSpec:
    """A model served by a remote backend: clients send ``name``, the upstream gets
    ``upstream_model`` (default: the same name). ``fallbacks`` are tried in turn when the
    backend fails before anything was streamed."""

    name: str
    backend: str
    upstream_model: str = ""
    aliases: tuple[str, ...] = model_knobs.ALIASES.default
    fallbacks: tuple[str, ...] = model_knobs.FALLBACKS.default
    fallback_on_busy: bool = model_knobs.FALLBACK_ON_BUSY.default  # the upstream's 429 too

    def __post_init__(self) -> None:
        if not self.name or not self.backend:
            raise ConfigError("every remote model needs a name and a backend")

    @property
    def upstream(self) -> str:
        """The model name sent to the backend."""
        return self.upstream_model or self.name


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A client key: its name (for logs and limits), its tier (priority) and optional limits.

    ``repr`` leaves the secret out, so logging a config never leaks it.
    """

    name: str
    key: str = field(repr=False)
    tier: str = "normal"
    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("every API key needs a name")
        if not self.key or not self.key.isascii() or not self.key.isprintable() or " " in self.key:
            raise ConfigError(f"API key {self.name!r} must be non-empty printable ASCII, no spaces")
        if self.tier not in API_KEY_TIERS:
            raise ConfigError(f"API key {self.name!r}: tier must be one of high, normal, low")
        for limit, what in ((self.rpm, "requests_per_minute"), (self.tpm, "tokens_per_minute")):
            if limit is not None and limit < 1:
                raise ConfigError(f"API key {self.name!r}: {what} must be >= 1")


# The narrow pieces of ``ServeConfig`` its parts take (STYLE 2.5), made by ``ServeConfig.piece``.
# Their fields are named as ServeConfig's, and checked with the same knobs.


@dataclass(frozen=True, slots=True)
class RestartLimits:
    """When the supervisor gives up on a crashing worker, and how long it waits before a
    restart (daemon/restart_policy.py): --max-crashes, --crash-window, --restart-backoff."""

    max_crashes: int = MAX_CRASHES.default
    crash_window_s: float = CRASH_WINDOW.default
    restart_backoff_s: float = RESTART_BACKOFF.default

    def __post_init__(self) -> None:
        _check_serve_knobs(self)


@dataclass(frozen=True, slots=True)
class HeartbeatLimits:
    """How long a worker may leave a ping unanswered, and stay in one engine step, before it is
    taken for hung (daemon/heartbeat.py): --heartbeat-timeout, --step-timeout."""

    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT.default
    step_timeout_s: float = STEP_TIMEOUT.default

    def __post_init__(self) -> None:
        _check_serve_knobs(self)


@dataclass(frozen=True, slots=True)
class RequestTimeouts:
    """The gateway's per-request limits in seconds: a request unanswered past its endpoint's
    gets 408; a stream whose client reads nothing for ``stream_stall_timeout_s`` is cut."""

    chat_timeout_s: float = CHAT_TIMEOUT.default  # /v1/chat/completions and /v1/messages
    completion_timeout_s: float = COMPLETION_TIMEOUT.default  # /v1/completions
    embeddings_timeout_s: float = EMBEDDINGS_TIMEOUT.default  # /v1/embeddings
    stream_stall_timeout_s: float = STREAM_STALL_TIMEOUT.default

    def __post_init__(self) -> None:
        _check_serve_knobs(self)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What the gateway accepts of a request body (its images too), whether it logs prompts,
    and how many Responses API responses it keeps (``store: true``)."""

    max_body_bytes: int = MAX_BODY_BYTES.default  # larger bodies get 413 before they are read
    log_prompts: bool = LOG_PROMPTS.default  # prompts go in the access log
    max_stored_responses: int = MAX_STORED_RESPONSES.default  # the least recently used go first
    max_stored_bytes: int = STORED_RESPONSES_SIZE.default  # their JSON size, all together
    # A request's images (gateway/images/): how many, how large, how their URLs are fetched.
    max_images: int = MAX_IMAGES.default
    max_image_bytes: int = MAX_IMAGE_BYTES.default
    image_fetch_timeout_s: float = IMAGE_FETCH_TIMEOUT.default
    allow_private_image_urls: bool = ALLOW_PRIVATE_IMAGE_URLS.default

    def __post_init__(self) -> None:
        _check_serve_knobs(self)


@dataclass(frozen=True, slots=True)
class GatewayAuth:
    """Who may call the gateway: client keys on /v1/*, the admin key on /admin/* over TCP."""

    api_keys: tuple[ApiKey, ...] = ()
    admin_key: str | None = field(default=ADMIN_KEY.default, repr=False)


Piece = TypeVar("Piece", RestartLimits, HeartbeatLimits, RequestTimeouts, HttpLimits, GatewayAuth)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """`mlxd start`: the gateway's address and the models it serves.

    Its settings are the knobs of serve_knobs.py (and the worker's of knobs.py); their
    defaults, ranges and error messages come from there, and ``from_options`` builds one from
    `mlxd start`'s options and config file.
    """

    models: tuple[ModelSpec, ...]
    host: str = HOST.default
    port: int = PORT.default
    ollama_port: int | None = OLLAMA_PORT.default  # a second listener, for Ollama's clients
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    # A request still unanswered after this long gets 408 and is cancelled in its worker.
    chat_timeout_s: float = CHAT_TIMEOUT.default  # /v1/chat/completions and /v1/messages
    completion_timeout_s: float = COMPLETION_TIMEOUT.default  # /v1/completions
    embeddings_timeout_s: float = EMBEDDINGS_TIMEOUT.default  # /v1/embeddings
    worker_start_timeout_s: float = 300.0  # no option: a model's load may take this long
    max_context: int | None = MAX_CONTEXT.default
    max_body_bytes: int = MAX_BODY_BYTES.default
    max_stored_responses: int = MAX_STORED_RESPONSES.default  # Responses API store: true
    max_stored_bytes: int = STORED_RESPONSES_SIZE.default
    max_images: int = MAX_IMAGES.default  # per request (gateway/images/)
    max_image_bytes: int = MAX_IMAGE_BYTES.default  # per image, inline or fetched
    image_fetch_timeout_s: float = IMAGE_FETCH_TIMEOUT.default  # one image URL's fetch
    allow_private_image_urls: bool = ALLOW_PRIVATE_IMAGE_URLS.default  # else refused
    api_keys: tuple[ApiKey, ...] = ()
    log_prompts: bool = LOG_PROMPTS.default
    admin_key: str | None = field(default=ADMIN_KEY.default, repr=False)  # guards /admin/*
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT.default  # a silent worker is restarted
    step_timeout_s: float = STEP_TIMEOUT.default  # so is an engine stuck in one step this long
    drain_timeout_s: float = DRAIN_TIMEOUT.default  # on SIGTERM, in-flight requests may run on
    # A worker that crashes this often within the window is marked failed, not restarted again;
    # restarts wait restart_backoff_s, doubling with each recent crash (at most 30 s).
    max_crashes: int = MAX_CRASHES.default
    crash_window_s: float = CRASH_WINDOW.default
    restart_backoff_s: float = RESTART_BACKOFF.default
    stream_stall_timeout_s: float = STREAM_STALL_TIMEOUT.default  # a stalled stream is cut
    max_memory_bytes: int | None = MAX_MEMORY.default  # every worker's weights + KV fit in it
    keep_alive_s: float = KEEP_ALIVE.default  # idle seconds before a worker is unloaded; 0 = never
    curve_keys: CurveKeys | None = field(default=None, repr=False)  # for tcp:// attached workers
    dtype: str = DTYPE.default  # each model's compute dtype unless its spec sets one (DTYPES)
    max_image_pixels: int = MAX_IMAGE_PIXELS.default  # each VLM worker's
    request_log: str | None = REQUEST_LOG.default  # the rotating request log; None: not written
    request_log_max_bytes: int = REQUEST_LOG_SIZE.default  # rotated past this (3 old files kept)
    backends: tuple[BackendSpec, ...] = ()  # remote APIs (docs/BACKENDS.md)
    remote_models: tuple[RemoteModelSpec, ...] = ()  # models served by those backends
    routing: str = ROUTING.default  # how a request picks one of a model's replicas (ROUTINGS)

    def __post_init__(self) -> None:
        _check_knobs(self, section("worker"))
        _check_knobs(self, SERVE_KNOBS)
        _check_routes(self)
        if len({k.name for k in self.api_keys}) != len(self.api_keys):
            raise ConfigError("API key names must be unique")
        if len({k.key for k in self.api_keys}) != len(self.api_keys):
            raise ConfigError("the same API key is configured twice")
        if not self.models and not self.remote_models:
            raise ConfigError("at least one model is needed")
        names = [n for m in _all_models(self) for n in (m.name, *m.aliases)]
        if len(set(names)) != len(names):
            raise ConfigError("model names and aliases must be unique")

    @classmethod
    def from_options(
        cls, options: Mapping[str, object], file: Mapping[str, object] | None = None, **parts: Any
    ) -> ServeConfig:
        """The config `mlxd start` serves. Each setting is its option in ``options`` (by the
        option's parameter name, as given: text for sizes and durations; None: not given),
        else the config file's in ``file`` (by field, parsed), else the knob's default.
        ``parts`` are the fields that are no knobs: models, backends, API keys, CURVE keys."""
        file = file or {}
        scheduler = SchedulerConfig.from_options(options, file)
        cache = CacheConfig.from_options(options, file)
        settings = given((*section("worker"), *SERVE_KNOBS), options, file)
        return cls(scheduler=scheduler, cache=cache, **settings, **parts)

    def keep_alive(self, spec: ModelSpec) -> float:
        """``spec``'s idle seconds before unloading (0 = never)."""
        return self.keep_alive_s if spec.keep_alive_s is None else spec.keep_alive_s

    def piece(self, cls: type[Piece]) -> Piece:
        """The narrow piece ``cls`` of this config (``RestartLimits``, ``HeartbeatLimits``,
        ``RequestTimeouts``, ``HttpLimits``, ``GatewayAuth``): the fields it names."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})


def _all_models(config: ServeConfig) -> list[ModelSpec | RemoteModelSpec]:
    return [*config.models, *config.remote_models]


def _check_routes(config: ServeConfig) -> None:
    """Backends named once; every remote model's backend and every fallback exists."""
    backends = {b.name for b in config.backends}
    if len(backends) != len(config.backends):
        raise ConfigError("backend names must be unique")
    for remote in config.remote_models:
        if remote.backend not in backends:
            raise ConfigError(f"model {remote.name!r}: no backend named {remote.backend!r}")
    models = {n for m in _all_models(config) for n in (m.name, *m.aliases)}
    for model in _all_models(config):
        for fallback in model.fallbacks:
            if fallback not in models or fallback in (model.name, *model.aliases):
                raise ConfigError(
                    f"model {model.name!r}: fallback {fallback!r} is not another model served here"
                )


def _check_knobs(config: object, knobs: tuple[Knob[object], ...]) -> None:
    for knob in knobs:
        knob.check(getattr(config, knob.field))


def _check_serve_knobs(piece: Any) -> None:
    names = {f.name for f in dataclasses.fields(piece)}
    _check_knobs(piece, tuple(k for k in SERVE_KNOBS if k.field in names))
