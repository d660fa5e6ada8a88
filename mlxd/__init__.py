"""mlxd: a local LLM serving daemon for MLX."""

from __future__ import annotations

import os

__version__ = "0.1.0"

# MLX's CUDA backend keeps each attention plan (one per query and key length) in a cache whose
# lifetime misses, past twice its size, raise "Cache thrashing is happening": fatal for a server
# whose shapes follow its traffic. Set here, before anything imports mlx.core; a user's own
# value wins. Ignored by the other backends. (docs/decisions/0004-cuda-attention-plans.md)
for _name, _value in (
    ("MLX_CUDA_SDPA_CACHE_SIZE", "4096"),
    ("MLX_ENABLE_CACHE_THRASHING_CHECK", "0"),
):
    os.environ.setdefault(_name, _value)
