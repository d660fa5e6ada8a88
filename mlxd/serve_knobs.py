"""The daemon's and the gateway's settings (``ServeConfig``), defined once, as knobs.py defines
the worker's: flag, field, type, default, range, help, TOML key and environment variable.

`mlxd start`'s options, ``ServeConfig``'s checks and defaults, and the top-level keys of its
`--config` file all come from this table (cli/knob_options.py, config.py, cli/config_file.py).
"""

from __future__ import annotations

from pathlib import Path

from mlxd.knobs import KNOBS, Knob
from mlxd.units import parse_duration, parse_memory

# cache_aware: the replica that served the prompt's prefix, unless much busier (SGLang's router);
# round_robin: in turn (the baseline the benchmark compares with).
ROUTINGS = ("cache_aware", "round_robin")


def _path_or_off(text: str) -> str | None:
    """``--request-log``: a path (``~`` expanded), or ``off`` for none."""
    return None if text == "off" else str(Path(text).expanduser())


def _param(flag: str) -> str:
    """The option's parameter name, as click derives it (``MLXD_START_*`` is named after it)."""
    return flag[2:].replace("-", "_")


def _seconds(flag: str, field: str, default: float, help: str, above: bool = True) -> Knob[float]:
    """A time in seconds that `mlxd start` takes as a number: > 0 (or >= 0 unless ``above``)."""
    return Knob(
        field,
        "serve",
        flag,
        float,
        default,
        help,
        minimum=0,
        above=above,
        unit=" seconds",
        dest=_param(flag),
    )


def _duration(flag: str, field: str, default: float, help: str, toml: str) -> Knob[float]:
    """A request timeout that `mlxd start` and its config file take as a duration ("15m")."""
    return Knob(
        field,
        "serve",
        flag,
        float,
        default,
        help,
        minimum=0,
        above=True,
        unit=" seconds",
        dest=_param(flag),
        metavar="DURATION",
        parse=parse_duration,
        toml=toml,
    )


# In the order of `mlxd start --help` (cli/start.py places each among the other options).
ROUTING: Knob[str] = Knob(
    "routing",
    "serve",
    "--routing",
    str,
    "cache_aware",
    "How a request picks a model's replica: the one that served its prompt's prefix unless "
    "much busier (cache_aware), or in turn (round_robin).",
    choices=ROUTINGS,
)
MAX_MEMORY: Knob[int | None] = Knob(
    "max_memory_bytes",
    "serve",
    "--max-memory",
    int,
    None,
    "Memory budget for all workers (weights + KV + headroom), e.g. 24GB or 75% (of the RAM); "
    "a model that does not fit unloads least recently used idle ones. On a host with several "
    "GPUs, each GPU's budget. Default: no budget.",
    minimum=0,
    above=True,
    dest="max_memory",
    metavar="SIZE",
    parse=parse_memory,
    toml="max_memory",
)
KEEP_ALIVE: Knob[float] = Knob(
    "keep_alive_s",
    "serve",
    "--keep-alive",
    float,
    0.0,
    "Unload a model's worker after this long idle (e.g. 300, 10m; 0 = never, the default).",
    minimum=0,
    unit=" seconds (0 = forever)",
    dest="keep_alive",
    metavar="DURATION",
    parse=parse_duration,
    toml="keep_alive",
)
HOST: Knob[str] = Knob("host", "serve", "--host", str, "127.0.0.1", "Address to listen on.")
PORT: Knob[int] = Knob(
    "port", "serve", "--port", int, 8000, "Port to listen on.", minimum=0, maximum=65535
)
OLLAMA_PORT: Knob[int | None] = Knob(
    "ollama_port",
    "serve",
    "--ollama-port",
    int,
    None,
    "Also serve the API on this port (on --host), e.g. 11434, Ollama's, so Ollama clients "
    "work unchanged. Default: only --port (which serves /api/* too).",
    minimum=0,
    maximum=65535,
)
LOG_PROMPTS: Knob[bool] = Knob(
    "log_prompts",
    "serve",
    "--log-prompts",
    bool,
    False,
    "Put prompts in the access log (mlxd.access); off by default.",
    negatable=False,
)
REQUEST_LOG: Knob[str | None] = Knob(
    "request_log",
    "serve",
    "--request-log",
    str,
    None,
    "Rotating file of one JSON line per request, never prompts or keys, for `mlxd logs` "
    "(env MLXD_REQUEST_LOG; default: requests.log in the data dir; off: none).",
    envvar="MLXD_REQUEST_LOG",
    metavar="PATH|off",
    parse=_path_or_off,
)
REQUEST_LOG_SIZE: Knob[int] = Knob(
    "request_log_max_bytes",
    "serve",
    "--request-log-size",
    int,
    10 * 2**20,  # 10 MiB, so at most 40 MiB with the 3 backups
    "Rotate the request log past this size; 3 older files are kept.",
    minimum=4096,
    unit=" bytes",
    dest="request_log_size",
    metavar="SIZE",
    parse=parse_memory,
    text_default="10MB",
)
ADMIN_KEY: Knob[str | None] = Knob(
    "admin_key",
    "serve",
    "--admin-key",
    str,
    None,
    "Let clients that send this key (Authorization: Bearer) use /admin/* over TCP; without "
    "one, admin is only reachable through the Unix socket this host's mlxd CLI uses.",
    envvar="MLXD_ADMIN_KEY",
    metavar="KEY",
)
HEARTBEAT_TIMEOUT = _seconds(
    "--heartbeat-timeout",
    "heartbeat_timeout_s",
    10.0,
    "Seconds a worker may leave a ping unanswered before it is killed and restarted.",
)
STEP_TIMEOUT = _seconds(
    "--step-timeout",
    "step_timeout_s",
    300.0,
    "Seconds one engine step may run (first kernel compiles included) before the worker is "
    "taken for hung, killed and restarted.",
)
DRAIN_TIMEOUT = _seconds(
    "--drain-timeout",
    "drain_timeout_s",
    10.0,
    "On SIGTERM/Ctrl-C, seconds in-flight requests may still run before they end with a "
    "shutting_down error.",
    above=False,
)
MAX_CRASHES: Knob[int] = Knob(
    "max_crashes",
    "serve",
    "--max-crashes",
    int,
    5,
    "A worker that crashes this often within --crash-window is marked failed (not restarted "
    "again) until `mlxd load MODEL`.",
    minimum=1,
)
CRASH_WINDOW = _seconds(
    "--crash-window",
    "crash_window_s",
    60.0,
    "Seconds over which --max-crashes counts a worker's crashes.",
)
RESTART_BACKOFF = _seconds(
    "--restart-backoff",
    "restart_backoff_s",
    0.5,
    "Seconds before restarting a crashed worker, doubled for each crash within --crash-window "
    "(at most 30 s).",
    above=False,
)
STREAM_STALL_TIMEOUT = _seconds(
    "--stream-stall-timeout",
    "stream_stall_timeout_s",
    30.0,
    "Seconds a streaming client may read nothing before its stream is cut and cancelled.",
)
CHAT_TIMEOUT = _duration(
    "--chat-timeout",
    "chat_timeout_s",
    900.0,
    "Longest a chat completion (or /v1/messages) may take before it is cut with 408 (e.g. "
    "900, 15m; default 15m, or chat_timeout in --config).",
    "chat_timeout",
)
COMPLETION_TIMEOUT = _duration(
    "--completion-timeout",
    "completion_timeout_s",
    600.0,
    "The same for /v1/completions (default 10m).",
    "completion_timeout",
)
EMBEDDINGS_TIMEOUT = _duration(
    "--embeddings-timeout",
    "embeddings_timeout_s",
    120.0,
    "The same for /v1/embeddings (default 2m).",
    "embeddings_timeout",
)
MAX_BODY_BYTES: Knob[int] = Knob(
    "max_body_bytes",
    "serve",
    "--max-body-bytes",
    int,
    8 * 1024 * 1024,
    "Largest request body accepted; bigger ones get 413 before they are read.",
    minimum=1024,
    click_range=True,
)
MAX_STORED_RESPONSES: Knob[int] = Knob(
    "max_stored_responses",
    "serve",
    "--max-stored-responses",
    int,
    1000,
    "How many Responses API responses (store: true) are kept for previous_response_id and "
    "retrieval; the least recently used go first, and an evicted id is a 404.",
    minimum=1,
    click_range=True,
    toml="max_stored_responses",
)
STORED_RESPONSES_SIZE: Knob[int] = Knob(
    "max_stored_bytes",
    "serve",
    "--stored-responses-size",
    int,
    256 * 2**20,
    "How much memory the kept Responses API responses may hold together (their JSON size).",
    minimum=4096,
    unit=" bytes",
    dest="stored_responses_size",
    metavar="SIZE",
    parse=parse_memory,
    text_default="256MB",
    toml="stored_responses_size",
)

# Images in requests (gateway/images/, surfaces/images.py).
MAX_IMAGES: Knob[int] = Knob(
    "max_images",
    "serve",
    "--max-images",
    int,
    8,
    "Most images one request may carry; more get 400.",
    minimum=1,
    click_range=True,
    toml="max_images",
)
MAX_IMAGE_BYTES: Knob[int] = Knob(
    "max_image_bytes",
    "serve",
    "--max-image-bytes",
    int,
    10 * 1024 * 1024,
    "Largest image (encoded bytes, inline or fetched from its URL) a request may carry; "
    "bigger ones get 400.",
    minimum=1024,
    click_range=True,
    toml="max_image_bytes",
)
IMAGE_FETCH_TIMEOUT = _seconds(
    "--image-fetch-timeout",
    "image_fetch_timeout_s",
    10.0,
    "Seconds the gateway may take to fetch one http(s) image URL (redirects included); a "
    "slower one is a 400.",
)
ALLOW_PRIVATE_IMAGE_URLS: Knob[bool] = Knob(
    "allow_private_image_urls",
    "serve",
    "--allow-private-image-urls",
    bool,
    False,
    "Fetch image URLs whose host resolves to a private, loopback or link-local address "
    "(refused by default, so a request cannot make the gateway reach the host's own network).",
    negatable=False,
)

_SERVE = (
    ROUTING,
    MAX_MEMORY,
    KEEP_ALIVE,
    HOST,
    PORT,
    OLLAMA_PORT,
    LOG_PROMPTS,
    REQUEST_LOG,
    REQUEST_LOG_SIZE,
    ADMIN_KEY,
    HEARTBEAT_TIMEOUT,
    STEP_TIMEOUT,
    DRAIN_TIMEOUT,
    MAX_CRASHES,
    CRASH_WINDOW,
    RESTART_BACKOFF,
    STREAM_STALL_TIMEOUT,
    CHAT_TIMEOUT,
    COMPLETION_TIMEOUT,
    EMBEDDINGS_TIMEOUT,
    MAX_BODY_BYTES,
    MAX_STORED_RESPONSES,
    STORED_RESPONSES_SIZE,
    MAX_IMAGES,
    MAX_IMAGE_BYTES,
    IMAGE_FETCH_TIMEOUT,
    ALLOW_PRIVATE_IMAGE_URLS,
)
SERVE_KNOBS: tuple[Knob[object], ...] = _SERVE  # type: ignore[assignment]
# What the top of a `mlxd start --config` file may set, beside [models.*] and [backends.*].
TOML_KNOBS = tuple(k for k in (*KNOBS, *SERVE_KNOBS) if k.toml)
