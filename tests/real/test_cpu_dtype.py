"""The real model computed in float32 (``--dtype auto`` on the CPU backend) against half
precision: greedy continuations of a fixed prompt set, in-process through mlx-lm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.real]

PROMPTS = [  # float16 on the CPU is slow: four short answers keep this under half a minute
    "What is the capital of France?",
    "Name three colours.",
    "Who wrote Hamlet?",
    "Say hello in Spanish.",
]
MAX_TOKENS = 6


def _greedy(directory: Path, dtype: str) -> list[str]:
    import mlx_lm

    from mlxd.worker import cpu_backend

    model, tokenizer = mlx_lm.load(str(directory))[:2]
    cpu_backend.prepare(model, dtype)
    return [_complete(model, tokenizer, p) for p in PROMPTS]


def _complete(model: Any, tokenizer: Any, prompt: str) -> str:
    from mlx_lm import generate

    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return str(generate(model, tokenizer, text, max_tokens=MAX_TOKENS))


def test_greedy_float32_agrees_with_float16(converted_dir: Path) -> None:
    # The weights dequantized to float32 once (the tier's conversion, shared with the daemon's
    # cache), then served as float32 or cast to float16: the same numbers, so only the compute
    # precision differs.
    single, half = _greedy(converted_dir, "float32"), _greedy(converted_dir, "float16")
    agree = sum(a == b for a, b in zip(single, half, strict=True))
    # Half and single precision may part at a near-tie: one of the four may differ.
    assert agree >= len(PROMPTS) - 1, list(zip(single, half, strict=True))
