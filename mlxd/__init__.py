"""mlxd: a local LLM serving daemon for MLX."""

from __future__ import annotations

__version__ = "0.1.0"
