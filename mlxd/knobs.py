"""Every setting, defined once: name, type, default, range, help, TOML key, env var, and
whether it is live.

The config values check themselves against these tables (config.py), the options of `mlxd start`
and `mlxd worker serve` are built from them (cli/knob_options.py), the top-level keys of
`mlxd start --config` are read through them (cli/config_file.py), and `mlxd worker set` takes
the live ones (gateway/ops/admin.py, worker/control.py). So a setting cannot drift between them:
before, ``max_num_seqs`` was listed by hand in six places (issue #25 point 5) and the daemon's
timeouts in four (issue #37 point 4). ``KNOBS`` are the worker's (``SchedulerConfig``,
``CacheConfig``, ``WorkerConfig``); serve_knobs.py has the daemon's and the gateway's
(``ServeConfig``), model_knobs.py each model's (``ModelSpec``, ``[models.NAME]``) and
backend_knobs.py each remote backend's (``[backends.NAME]``), in the same shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mlxd.errors import ConfigError

T = TypeVar("T")

# Request priorities, highest first: a request's ``priority`` (or ``X-Priority``), an API key's
# tier (which caps it), the order of a worker's queue and of a remote backend's slots.
PRIORITIES = ("high", "normal", "low")

# How a worker computes with float weights (worker/cpu_backend.py): "auto" casts half precision
# to float32 on the CPU backend only, "file" keeps the file's dtypes, a dtype casts to it.
DTYPES = ("auto", "float32", "float16", "bfloat16", "file")


@dataclass(frozen=True, slots=True)
class Knob(Generic[T]):
    """One knob. ``field`` names it in its config class (``section``) and in `worker set`;
    ``flag`` is its command-line option, ``dest`` that option's parameter name where it differs
    from ``field`` (kept, as ``MLXD_*`` environment variables are named after it).

    ``parse`` turns a given value (the option's text, the TOML value) into the field's: sizes
    and durations. An option with a parser takes text; its default is ``text_default`` (as
    ``--help`` shows it) or unset. ``toml`` is its key at the top of `mlxd start --config`;
    an option the file can set defaults to unset, so that the file's value shows through.
    """

    field: str
    # "scheduler" (SchedulerConfig), "cache" (CacheConfig), "worker" (both configs), "serve"
    # (ServeConfig, serve_knobs.py), "model" (ModelSpec, model_knobs.py), "backend" (BackendSpec,
    # backend_knobs.py); a "model" knob has a flag only where `mlxd start` sets it for every model
    section: str
    flag: str
    kind: type  # int, float, bool or str; the type of a set value (None: unset)
    default: T
    help: str
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is out of range (> rather than >=)
    unit: str = ""  # said after the bound in errors: "--priority-aging must be > 0 seconds"
    choices: tuple[str, ...] = ()
    live: bool = False  # changeable on a running worker (`mlxd worker set`)
    dest: str = ""
    toml: str = ""  # key at the top of the --config file ("": none)
    envvar: str = ""  # environment variable read for the option ("": click's MLXD_START_*)
    metavar: str = ""
    parse: Callable[[Any], Any] | None = None  # given text or TOML value -> the field's value
    text_default: str | None = None  # the option's default as written, for ``parse``
    negatable: bool = True  # a bool option has a --no- form
    click_range: bool = False  # click refuses an int below ``minimum`` (a usage error, exit 2)

    @property
    def param(self) -> str:
        """The click parameter name (and ``opts`` key) of this knob's option."""
        return self.dest or self.field

    @property
    def option_default(self) -> object:
        """The option's default: unset where the config file or a parser has the say."""
        if self.parse is not None:
            return self.text_default
        return None if self.toml else self.default

    @property
    def bound(self) -> str:
        """The range in words, without the unit: ">= 1", "in 1..1024", "one of a, b"."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        if self.minimum is not None and self.maximum is not None:
            return f"in {self.minimum:g}..{self.maximum:g}"
        return f"{'>' if self.above else '>='} {self.minimum:g}"

    @property
    def rule(self) -> str:
        """The range in words: ">= 1", "> 0 seconds", "in 1..1024", "one of a, b"."""
        one_sided = not self.choices and self.maximum is None
        return f"{self.bound}{self.unit}" if one_sided else self.bound

    def is_valid(self, value: object) -> bool:
        """Whether ``value`` is in range (``None``, unset, always is)."""
        if value is None or (not self.choices and self.minimum is None):
            return True
        if self.choices:
            return value in self.choices
        number = float(value)  # type: ignore[arg-type]
        low = self.minimum if self.minimum is not None else float("-inf")
        high = self.maximum if self.maximum is not None else float("inf")
        return (number > low if self.above else number >= low) and number <= high

    def check(self, value: object, what: str = "") -> None:
        """Raise ``ConfigError`` naming ``what`` (default: the flag) when out of range."""
        if not self.is_valid(value):
            tail = f", not {value!r}" if self.choices else ""
            raise ConfigError(f"{what or self.flag} must be {self.rule}{tail}")


MAX_NUM_SEQS: Knob[int] = Knob(
    "max_num_seqs",
    "scheduler",
    "--max-num-seqs",
    int,
    64,
    "Most sequences decoded together.",
    minimum=1,
    live=True,
)
MAX_QUEUED: Knob[int] = Knob(
    "max_queued",
    "scheduler",
    "--max-queued",
    int,
    256,
    "Most requests waiting; beyond it clients get 429.",
    minimum=0,
    live=True,
)
PREFILL_CHUNK: Knob[int] = Knob(
    "prefill_chunk",
    "scheduler",
    "--prefill-chunk",
    int,
    2048,
    "Prompt tokens per step, so long prompts never stall running streams.",
    minimum=16,
    live=True,
)
STREAM_INTERVAL: Knob[int] = Knob(
    "stream_interval",
    "scheduler",
    "--stream-interval",
    int,
    1,
    "Send output every N tokens.",
    minimum=1,
    live=True,
)
AGING_S: Knob[float] = Knob(
    "aging_s",
    "scheduler",
    "--priority-aging",
    float,
    10.0,
    "Seconds of waiting that raise a request by one priority level.",
    minimum=0,
    above=True,
    unit=" seconds",
    live=True,
)
KV_CACHE_GB: Knob[float | None] = Knob(
    "kv_cache_gb",
    "cache",
    "--kv-cache-gb",
    float,
    None,
    "KV block pool size per model (default: half the memory the weights leave, at most "
    "max-num-seqs full contexts).",
    minimum=0,
    above=True,
    toml="kv_cache_gb",
)
BLOCK_SIZE: Knob[int] = Knob(
    "block_size",
    "cache",
    "--kv-block-size",
    int,
    32,
    "Tokens per KV cache block.",
    minimum=1,
    maximum=1024,
    dest="kv_block_size",
)
KV_CHUNK_MB: Knob[float] = Knob(
    "kv_chunk_mb",
    "cache",
    "--kv-chunk-mb",
    float,
    64.0,
    "MiB the KV block pool starts with and grows by (or a quarter of what it holds, if more), "
    "up to its budget.",
    minimum=0,
    above=True,
)
KV_IDLE_S: Knob[float] = Knob(
    "kv_idle_s",
    "cache",
    "--kv-idle-s",
    float,
    30.0,
    "Seconds without work after which a worker gives KV memory back: the pool shrinks to one "
    "chunk (keeping the prefix-cache blocks in it) and MLX's buffer cache is freed (0: never).",
    minimum=0,
    unit=" seconds",
)
KV_DISK_GB: Knob[float] = Knob(
    "kv_disk_gb",
    "cache",
    "--kv-disk-gb",
    float,
    0.0,
    "GiB of prefix-cache KV blocks kept on disk (under the data directory, by model) when "
    "evicted from memory, and read back on a later hit, also after a restart (0: none).",
    minimum=0,
)
KV_BITS: Knob[int | None] = Knob(
    "kv_bits",
    "cache",
    "--kv-bits",
    int,
    None,
    "Store the paged KV pool quantized to 8 or 4 bits (2-8 as mx.quantize takes; default: the "
    "compute dtype): about 1.9x / 3.5x the tokens in the same memory, batching and the prefix "
    "cache on. Models on their own caches (sliding windows, hybrids) ignore it.",
    minimum=2,
    maximum=8,
)
KV_GROUP_SIZE: Knob[int] = Knob(
    "kv_group_size",
    "cache",
    "--kv-group-size",
    int,
    64,
    "Values of head_dim sharing one scale and bias with --kv-bits (32, 64 or 128).",
    minimum=32,
    maximum=128,
)
PAGED: Knob[bool] = Knob(
    "paged",
    "cache",
    "--paged-kv",
    bool,
    True,
    "Keep KV in the block pool (prefix cache, preemption) or contiguous per batch.",
    dest="paged_kv",
)
MAX_CONTEXT: Knob[int | None] = Knob(
    "max_context",
    "worker",
    "--max-context",
    int,
    None,
    "Cap on prompt + output tokens (default: the model's).",
    minimum=2,
)
DTYPE: Knob[str] = Knob(
    "dtype",
    "worker",
    "--dtype",
    str,
    "auto",
    "Float weights as computed: auto casts half precision to float32 on the CPU backend (fast "
    "BLAS, twice the memory) and keeps them elsewhere; file keeps the file's.",
    choices=DTYPES,
)
MAX_IMAGE_PIXELS: Knob[int] = Knob(
    "max_image_pixels",
    "worker",
    "--max-image-pixels",
    int,
    50_000_000,
    "Largest image (width x height, read from its header before it is decoded) a vision "
    "model takes; a larger one is a 400, never decoded.",
    minimum=1,
)

SPECULATE: Knob[str] = Knob(
    "speculate",
    "scheduler",
    "--speculate",
    str,
    "auto",
    "Speculative decoding: ngram drafts tokens from each request's own prompt and output "
    "(prompt lookup) and verifies them in the batch's forward; draft has --draft-model propose "
    "them; off decodes one token per step; auto is ngram except on CUDA, where verifying costs "
    "more than it saves (docs/SPECULATION.md). Requests opt out with speculate: false.",
    choices=("auto", "ngram", "draft", "off"),
)
DRAFT_MODEL: Knob[str | None] = Knob(
    "draft_model",
    "scheduler",
    "--draft-model",
    str,
    None,
    "With --speculate draft: a small model sharing the target's vocabulary (a directory or a "
    "repo id, as a model) that greedily proposes each row's draft tokens.",
)
WARMUP_S: Knob[float | None] = Knob(
    "warmup_s",
    "scheduler",
    "--warmup-s",
    float,
    None,
    "Seconds a loading worker may spend building the kernels its first requests need (a long "
    "prompt's chunks, decode at 1-64 rows, the sampler) before it serves; shown as warming. "
    "Default: 20 on a GPU, 0 (none) on the CPU, where the first prompt costs what later ones do.",
    minimum=0,
    unit=" seconds",
)

# In the order their options are listed in `--help`.
_ALL = (
    MAX_NUM_SEQS,
    MAX_QUEUED,
    PREFILL_CHUNK,
    STREAM_INTERVAL,
    AGING_S,
    SPECULATE,
    DRAFT_MODEL,
    WARMUP_S,
    KV_CACHE_GB,
    BLOCK_SIZE,
    KV_CHUNK_MB,
    KV_IDLE_S,
    KV_DISK_GB,
    KV_BITS,
    KV_GROUP_SIZE,
    PAGED,
    MAX_CONTEXT,
    DTYPE,
    MAX_IMAGE_PIXELS,
)
KNOBS: tuple[Knob[object], ...] = _ALL  # type: ignore[assignment]
LIVE_KNOBS = tuple(k for k in KNOBS if k.live)


def section(name: str) -> tuple[Knob[object], ...]:
    """The knobs of one config class: "scheduler", "cache" or "worker"."""
    return tuple(k for k in KNOBS if k.section == name)


def live_knob(field: str) -> Knob[object] | None:
    """The live knob named ``field``, or None (not a knob, or not settable while running)."""
    return next((k for k in LIVE_KNOBS if k.field == field), None)


def given(
    knobs: tuple[Knob[object], ...], options: Mapping[str, object], file: Mapping[str, object]
) -> dict[str, Any]:
    """The fields of ``knobs`` that were set, by field: an option given in ``options`` (by
    parameter name, parsed), else the config file's value in ``file`` (by field, parsed when
    read). A field set by neither is left out, so its config class's default (the knob's)
    holds."""
    out: dict[str, Any] = {}
    for knob in knobs:
        raw = options.get(knob.param)
        if raw is not None:
            out[knob.field] = raw if knob.parse is None else knob.parse(raw)
        elif knob.field in file:
            out[knob.field] = file[knob.field]
    return out
