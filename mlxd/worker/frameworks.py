"""Deep-learning frameworks a worker never runs, hidden from its imports before anything loads.

mlx-lm imports transformers for its tokenizers, and transformers imports whatever frameworks it
finds installed: on a host with PyTorch and scikit-learn beside MLX (the lent H200's, and many
a user's Python), ``import mlxd.worker.main`` took 13.7 s, of which PyTorch with its compiler and
scikit-learn (through transformers' generation utilities) took the most; with them hidden 4.5 s,
and the same tokens from the same tokenizer (docs/PERFORMANCE.md, run TA1). A model's load on
demand paid it every time. A worker runs MLX only, so it behaves as on a host without them, the
host our tests run on: a name set to None in ``sys.modules`` makes ``import`` raise ImportError and
``importlib.util.find_spec`` answer None, which is how transformers asks whether a package is
installed. A framework some other import already brought in is left as it is.

No MLX or transformers import here: this module runs before them.
"""

from __future__ import annotations

import sys

HIDDEN = ("torch", "torchvision", "torchaudio", "sklearn", "tensorflow", "jax", "flax")


def hide(modules: dict[str, object] | None = None) -> list[str]:
    """Hide ``HIDDEN`` from later imports in this process (``modules``: ``sys.modules``); the
    names it hid."""
    table = sys.modules if modules is None else modules
    hidden = [name for name in HIDDEN if name not in table]
    for name in hidden:
        table[name] = None
    return hidden
