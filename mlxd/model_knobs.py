"""Each model's settings (``ModelSpec``), defined once, as knobs.py and serve_knobs.py define the
worker's and the daemon's: field, type, default, range, help, and the key of a config file's
``[models.NAME]`` table that sets it.

``ModelSpec``'s defaults and checks (config.py), the keys a ``[models.NAME]`` table takes and
how their values are read (cli/config_file.py, cli/backend_options.py for a remote model's), and
the `mlxd start` options that set one for every local model (``--replicas``, ``--group-size``,
``--distributed``, ``--gpus``: the knobs with a flag) all come from this table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from mlxd import knobs
from mlxd.gpus import parse_gpus
from mlxd.knobs import Knob
from mlxd.units import parse_duration

T = TypeVar("T")

# mlx.distributed backends a worker group may use: ring (TCP; CPU, Macs over Thunderbolt IP),
# nccl (CUDA GPUs). JACCL (RDMA over Thunderbolt 5) needs mlx.launch's setup: attach with --worker.
DISTRIBUTED_BACKENDS = ("ring", "nccl")


def _model_knob(field: str, kind: type, default: T, help: str, **rule: Any) -> Knob[T]:
    """A setting of one model, without an option of its own: its TOML key is ``field``."""
    return Knob(field, "model", "", kind, default, help, toml=field, **rule)


def _for_one_model(knob: Knob[Any], help: str) -> Knob[Any]:
    """The worker's ``knob`` (its type, range and TOML key) set for one model; unset, the
    daemon's option holds."""
    return replace(knob, section="model", flag="", default=None, help=help, toml=knob.field)


# In the order of the module docstring of cli/config_file.py. A ``tuple`` knob is a TOML list of
# names; the others are read as knobs.py's are (``parse``: a duration; float: any number).
ALIASES: Knob[tuple[str, ...]] = _model_knob(
    "aliases", tuple, (), "More names clients may send for the model."
)
KEEP_ALIVE: Knob[float | None] = Knob(
    "keep_alive_s",
    "model",
    "",
    float,
    None,
    "Unload the model's worker after this long idle (0 = never; default: --keep-alive).",
    minimum=0,
    unit=" (0 = forever)",
    parse=parse_duration,
    toml="keep_alive",
)
PINNED: Knob[bool] = _model_knob(
    "pinned", bool, False, "Never unloaded to make room for another model."
)
PRELOAD: Knob[bool] = _model_knob(
    "preload", bool, True, "Loaded when the daemon starts (else on its first request)."
)
KV_CACHE_GB: Knob[float | None] = _for_one_model(
    knobs.KV_CACHE_GB, "The model's KV cache in GiB, in the memory budget (default: --kv-cache-gb)."
)
DTYPE: Knob[str | None] = _for_one_model(
    knobs.DTYPE, "How its float weights are computed, one of --dtype's (default: --dtype)."
)
FALLBACKS: Knob[tuple[str, ...]] = _model_knob(
    "fallbacks", tuple, (), "Models tried in turn when this one is unavailable."
)
FALLBACK_ON_BUSY: Knob[bool] = _model_knob(
    "fallback_on_busy", bool, False, "Its 429 (queue full) goes to the fallbacks too."
)
REPLICAS: Knob[int] = Knob(
    "replicas",
    "model",
    "--replicas",
    int,
    1,
    "Workers per local model (each its own process and KV cache); requests are routed "
    "by --routing. Default 1, or `replicas` in the model's [models.NAME] table.",
    minimum=1,
    toml="replicas",
    click_range=True,
)
GROUP_SIZE: Knob[int | None] = Knob(
    "group_size",
    "model",
    "--group-size",
    int,
    None,
    "Processes per local worker over mlx.distributed: tensor parallel on mlx-lm models "
    "with shard(); rank 0 talks to the gateway (docs/ARCHITECTURE.md, scale-out). Default 1, "
    "or `group_size` in [models.NAME]; unset, a model too big for one GPU's --max-memory "
    "takes the fewest GPUs that hold it.",
    minimum=1,
    toml="group_size",
    click_range=True,
)
DISTRIBUTED: Knob[str | None] = Knob(
    "distributed",
    "model",
    "--distributed",
    str,
    None,
    "The group's mlx.distributed backend: ring (TCP; CPU, Macs) or nccl (CUDA). Default "
    "nccl for a group on the host's CUDA GPUs, else ring, or `distributed` in [models.NAME].",
    choices=DISTRIBUTED_BACKENDS,
    toml="distributed",
)
GPUS: Knob[tuple[str, ...]] = Knob(
    "gpus",
    "model",
    "--gpus",
    tuple,
    (),
    "The GPUs each local model's workers run on, e.g. 1 or 0,1 (entries of "
    "CUDA_VISIBLE_DEVICES, else the driver's indices); replicas take group-size of them in "
    "turn. Default: the GPUs no model names, in turn, or `gpus` in [models.NAME].",
    metavar="LIST",
    parse=parse_gpus,
    toml="gpus",
)

_MODEL = (
    ALIASES,
    KEEP_ALIVE,
    PINNED,
    PRELOAD,
    KV_CACHE_GB,
    DTYPE,
    FALLBACKS,
    FALLBACK_ON_BUSY,
    REPLICAS,
    GROUP_SIZE,
    DISTRIBUTED,
    GPUS,
)
MODEL_KNOBS: tuple[Knob[object], ...] = _MODEL  # type: ignore[assignment]
# The `mlxd start` options that set a knob for every local model (they win over the file's key).
MODEL_OPTIONS = tuple(k for k in MODEL_KNOBS if k.flag)
# What a model served by a remote backend (``RemoteModelSpec``) shares with a local one.
_ROUTE = (ALIASES, FALLBACKS, FALLBACK_ON_BUSY)
ROUTE_KNOBS: tuple[Knob[object], ...] = _ROUTE  # type: ignore[assignment]
# How a worker group is made: a ``WorkerConfig`` carries these of its model.
GROUP_KNOBS: tuple[Knob[object], ...] = (GROUP_SIZE, DISTRIBUTED)  # type: ignore[assignment]
# Older spellings a model table still takes, and the key each stands for.
TOML_SPELLINGS = {"fallback": "fallbacks"}


def model_rule(knob: Knob[object], value: object, model: str) -> None:
    """``knob``'s check for model ``model``: "model 'm': replicas must be >= 1"."""
    knob.check(value, f"model {model!r}: {knob.toml}")
