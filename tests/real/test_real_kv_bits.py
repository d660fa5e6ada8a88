"""The real model with quantized paged KV (``--kv-bits``) against float KV: greedy answers of a
fixed prompt set, in-process through the paged engine, agree for their first tokens (8 bits:
at least 24 of 32 on 4 of 5 prompts; all 32 on all 5 measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.model.conftest import Harness

pytestmark = [pytest.mark.real]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Who wrote Hamlet?",
    "Explain what a hash table is.",
    "Give three tips for sleeping well.",
]
MAX_TOKENS = 32


def _greedy(directory: Path, bits: int | None) -> list[list[int]]:
    from mlxd.worker.kv.formats import KVFormat

    h = Harness(directory, block_size=16, kv_format=KVFormat(bits))
    try:
        tok = h.engine.encoder.tokenizer
        for i, p in enumerate(PROMPTS):
            messages = [{"role": "user", "content": p}]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            h.generate_ids(
                str(i),
                tok.encode(text, add_special_tokens=False),
                max_tokens=MAX_TOKENS,
                ignore_eos=True,
            )
        res = h.run()
        return [res[str(i)].token_ids for i in range(len(PROMPTS))]
    finally:
        h.close()


def _agreed(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_8bit_kv_agrees_with_float_kv(converted_dir: Path) -> None:
    full, eight, four = (_greedy(converted_dir, bits) for bits in (None, 8, 4))
    agree8 = [_agreed(a, b) for a, b in zip(full, eight, strict=True)]
    agree4 = [_agreed(a, b) for a, b in zip(full, four, strict=True)]
    # Measured on the CPU (float32 compute, groups of 64): 8-bit [32, 32, 32, 32, 32], 4-bit
    # [0, 1, 4, 16, 0] (SmolLM2's keys have outlier channels; 4 bits is a memory-first mode).
    assert sum(n >= 24 for n in agree8) >= 4, agree8
    assert min(agree4) < MAX_TOKENS, agree4  # the pool does quantize: 4 bits shows it
