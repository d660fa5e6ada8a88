"""A remote backend's settings (``BackendSpec``), defined once, as model_knobs.py defines a
model's: field, type, default, range, help, and the key of a ``[backends.NAME]`` table.

``BackendSpec``'s defaults and checks (config.py) and the keys a ``[backends.NAME]`` table takes
and how their values are read (cli/backend_options.py) come from this table. What names the
backend (``kind``, ``base_url``) and its key's variable and headers are checked by hand there.
"""

from __future__ import annotations

from mlxd.knobs import Knob
from mlxd.units import parse_duration

TIMEOUT: Knob[float] = Knob(
    "timeout_s",
    "backend",
    "",
    float,
    60.0,
    "Longest silence from the upstream (connect included) before the request fails with 504 "
    "(or fails over).",
    minimum=0,
    above=True,
    unit=" seconds",
    parse=parse_duration,
    toml="timeout",
)
MAX_CONCURRENCY: Knob[int | None] = Knob(
    "max_concurrency",
    "backend",
    "",
    int,
    None,
    "Requests sent at once; more wait in line, high priority first (default: no limit).",
    minimum=1,
    toml="max_concurrency",
)
BREAKER_FAILURES: Knob[int] = Knob(
    "breaker_failures",
    "backend",
    "",
    int,
    5,
    "Failures in a row that open the circuit breaker.",
    minimum=1,
    toml="breaker_failures",
)
BREAKER_COOLDOWN: Knob[float] = Knob(
    "breaker_cooldown_s",
    "backend",
    "",
    float,
    30.0,
    "Then nothing is sent for this long, then one probe.",
    minimum=0,
    above=True,
    unit=" seconds",
    parse=parse_duration,
    toml="breaker_cooldown",
)

_BACKEND = (TIMEOUT, MAX_CONCURRENCY, BREAKER_FAILURES, BREAKER_COOLDOWN)
BACKEND_KNOBS: tuple[Knob[object], ...] = _BACKEND  # type: ignore[assignment]


def backend_rule(knob: Knob[object], value: object, backend: str) -> None:
    """``knob``'s check for backend ``backend``: "backend 'up': timeout must be > 0 seconds"."""
    knob.check(value, f"backend {backend!r}: {knob.toml}")
