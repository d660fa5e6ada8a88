"""Survey the zoo in-process: build each arch, greedy-generate, list its cache kinds.

Usage: .venv/bin/python scripts/zoo_survey.py [ARCH ...]   (default: every zoo arch but UNSTABLE)

One row per arch: cache kinds of ``model.make_cache()`` (class names, in layer order, runs
collapsed), #caches vs #layers, distinct tokens among 16 greedy ones, and ok or the error.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import mlx_lm

from mlxd.models.zoo import EXCLUDED, UNSTABLE, archs, cache_kinds, collapse, make_zoo_model

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + " * 2
NUM_TOKENS = 16


def survey(arch: str, root: Path) -> str:
    try:
        path = make_zoo_model(root / arch, arch)
        model, tokenizer = mlx_lm.load(str(path))[:2]
        kinds = cache_kinds(model)
        prompt = tokenizer.encode(PROMPT)[:40]
        tokens = list(_greedy(model, prompt))
        status = f"ok, {len(set(tokens))} distinct of {len(tokens)}"
        return f"{arch:24} {len(kinds):2}/{len(model.layers):<2} {collapse(kinds):50} {status}"
    except Exception as exc:  # noqa: BLE001 - a survey reports every failure and goes on
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(last.filename).name}:{last.lineno}"
        return f"{arch:24} ERROR {type(exc).__name__}: {str(exc)[:160]} ({where})"


def _greedy(model: Any, prompt: list[int]) -> Any:
    from mlx_lm.generate import generate_step

    for token, _ in generate_step(mx_array(prompt), model, max_tokens=NUM_TOKENS):
        yield int(token)


def mx_array(ids: list[int]) -> Any:
    import mlx.core as mx

    return mx.array(ids)


def main(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for arch in argv or [a for a in archs() if a not in UNSTABLE]:
            print(survey(arch, Path(tmp)), flush=True)
    for arch, why in [] if argv else sorted({**EXCLUDED, **UNSTABLE}.items()):
        print(f"{arch:24} LEFT OUT: {why}")


if __name__ == "__main__":
    main(sys.argv[1:])
