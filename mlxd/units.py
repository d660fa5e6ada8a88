"""Sizes and durations as people write them ("16GB", "75%", "10m"), parsed to bytes and seconds.

The knob table (knobs.py) names these as the parsers of its size and duration settings.
"""

from __future__ import annotations

import os

from mlxd.errors import ConfigError

_SIZE_UNITS = {
    "": 2**30,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tb": 2**40,
    "tib": 2**40,
}
_TIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_memory(text: str | float, total_bytes: int | None = None) -> int:
    """``"16GB"``, ``"512MiB"``, ``"1.5"`` (GB), ``"75%"`` (of ``total_bytes``, default the RAM)
    -> bytes. GB and GiB both mean 2**30, as memory is counted."""
    raw = str(text).strip().lower().replace(" ", "")
    try:
        if raw.endswith("%"):
            share = float(raw[:-1])
            if not 0 < share <= 100:
                raise ValueError
            return int(share / 100 * (total_bytes or physical_memory()))
        number = raw.rstrip("kmgtib")
        unit = _SIZE_UNITS[raw[len(number) :]]
        value = float(number) * unit
        if value <= 0:
            raise ValueError
        return int(value)
    except (ValueError, KeyError):
        raise ConfigError(f"bad memory size {text!r}: use e.g. 16GB, 512MB or 75%") from None


def parse_duration(text: str | float) -> float:
    """``"300"``, ``"30s"``, ``"5m"``, ``"1h"`` -> seconds (``0`` = forever, for keep-alive)."""
    raw = str(text).strip().lower()
    number = raw.rstrip("smh")
    try:
        seconds = float(number) * _TIME_UNITS[raw[len(number) :]]
    except (ValueError, KeyError):
        raise ConfigError(f"bad duration {text!r}: use e.g. 300, 30s, 5m or 1h") from None
    if seconds < 0:
        raise ConfigError(f"bad duration {text!r}: must be >= 0")
    return seconds


def physical_memory() -> int:
    """This machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
