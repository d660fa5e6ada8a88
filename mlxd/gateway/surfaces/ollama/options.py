"""Ollama's ``options`` -> ``SamplingParams``: the sampling options mlxd has, checked and mapped;
the runner options (``num_gpu``, ``num_thread``, ``mirostat``...) ignored, as Ollama ignores the
ones a model's runner does not use.

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9), not OpenAI's, so an app sees the
sampling it saw on Ollama, on a local model. ``defaulted`` names the ones the client left to
them: a remote backend is not sent those (its own defaults hold; an OpenAI-compatible API has no
``top_k``), while an option the client did send and the backend cannot take is a 400 naming it.

``repeat_penalty`` is applied only when sent: Ollama's 1.1 default penalises a 64-token window,
which mlxd's penalty (over the whole output) is not.
"""

from __future__ import annotations

import math
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import SamplingParams
from mlxd.protocol.validate import MAX_INT, MAX_SEED, MAX_STOP, SAMPLING_BOUNDS

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
# The options whose default is Ollama's, not the neutral one (also the SamplingParams fields).
SURFACE_DEFAULTS = ("temperature", "top_p", "top_k")

# Options mlxd maps (below) and the ones it accepts and ignores (Ollama's runner options).
MAPPED = frozenset(
    {
        "num_predict",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "num_ctx",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
    }
)
IGNORED = frozenset(
    {
        "num_keep",
        "typical_p",
        "repeat_last_n",
        "tfs_z",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "penalize_newline",
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "num_thread",
    }
)


def sampling_params(options: Any) -> SamplingParams:
    """``options`` (an object or null) as sampling parameters; ``InvalidRequest`` naming the
    option when a mapped one has the wrong type or range. Unknown options are ignored."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise InvalidRequest("'options' must be an object", param="options")
    return SamplingParams(
        max_tokens=_max_tokens(options),
        temperature=_number(options, "temperature", DEFAULT_TEMPERATURE),
        top_p=_number(options, "top_p", DEFAULT_TOP_P),
        top_k=_int(options, "top_k", DEFAULT_TOP_K, 0),
        min_p=_number(options, "min_p", 0.0),
        repetition_penalty=_number(options, "repeat_penalty", 1.0, "repetition_penalty"),
        presence_penalty=_number(options, "presence_penalty", 0.0),
        frequency_penalty=_number(options, "frequency_penalty", 0.0),
        seed=_seed(options),
        stop=_stop(options.get("stop")),
    )


def defaulted(options: Any) -> frozenset[str]:
    """The sampling fields ``options`` leaves to Ollama's defaults (``SURFACE_DEFAULTS``)."""
    sent = options if isinstance(options, dict) else {}
    return frozenset(k for k in SURFACE_DEFAULTS if sent.get(k) is None)


def check_num_ctx(options: Any) -> None:
    """``num_ctx`` is checked and otherwise ignored: a worker's context is fixed when it loads
    (``--max-context``); a prompt longer than it is a 400 as on the other APIs."""
    if isinstance(options, dict):
        _int(options, "num_ctx", 0, 0)


# Internal helpers


def _max_tokens(options: dict[str, Any]) -> int | None:
    # Ollama: -1 generates until the model stops, -2 until the context is full.
    value = _int(options, "num_predict", -1, -2)
    if value == 0:
        raise InvalidRequest("'options.num_predict' must be >= 1, or -1 or -2", param="num_predict")
    return None if value < 0 else value


def _int(options: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON numbers from JavaScript clients: 40.0
    if type(value) is not int or not minimum <= value <= MAX_INT:
        raise InvalidRequest(f"'options.{key}' must be an integer >= {minimum}", param=key)
    return value


def _number(options: dict[str, Any], key: str, default: float, bounds: str | None = None) -> float:
    value = options.get(key)
    if value is None:
        return default
    b = SAMPLING_BOUNDS[bounds or key]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (is_number and math.isfinite(value) and b.contains(value)):
        high = "" if b.high == math.inf else f" and <= {b.high:g}"
        low = ">" if b.low_open else ">="
        raise InvalidRequest(f"'options.{key}' must be a number {low} {b.low:g}{high}", param=key)
    return float(value)


def _seed(options: dict[str, Any]) -> int | None:
    value = options.get("seed")
    if value is None:
        return None
    if type(value) is not int or not -MAX_SEED - 1 <= value <= MAX_SEED:
        raise InvalidRequest("'options.seed' must be an integer that fits in 64 bits", param="seed")
    return value


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else [] if value is None else value
    ok = isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)
    if not ok or len(stops) > MAX_STOP:
        msg = f"'options.stop' must be a string or a list of at most {MAX_STOP} strings"
        raise InvalidRequest(msg, param="stop")
    return list(stops)
