"""Quantized paged KV (``--kv-bits``): smaller blocks, more contexts in a budget, and within one
mode the same greedy output whatever the schedule (prefix hits, preemption, the view or the
gathered path, speculation) and through the disk tier.

The tiny model's head_dim (16) is below the smallest group, so these run the ``small`` preset
(head_dim 64).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.model.conftest import Harness, harnesses
from tests.model.test_engine import sequences_hold_no_blocks

pytestmark = pytest.mark.model

SYSTEM = "You are a careful assistant. Answer briefly, in plain words, and cite nothing. " * 3
QUESTIONS = [
    "What is MLX?",
    "Why is the sky blue?",
    "Name three prime numbers.",
    "Count to five.",
    "What is a block table?",
]
PROMPTS = [SYSTEM + q for q in QUESTIONS]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.maker import make_model

    out = tmp_path_factory.mktemp("models") / "small-qwen3"
    return make_model(out, arch="qwen3", size="small", progress=lambda line: None)


@pytest.fixture
def harness(small_model: Path) -> Any:
    with harnesses(small_model) as make:
        yield make


def fmt(bits: int | None) -> Any:
    from mlxd.worker.kv.formats import KVFormat

    return KVFormat(bits)


@pytest.mark.parametrize(
    ("dtype", "dim", "low8", "low4"),
    [("float16", 64, 1.85, 3.5), ("float16", 128, 1.85, 3.5), ("float32", 64, 3.5, 6.0)],
)
def test_blocks_shrink_with_the_bits(dtype: str, dim: int, low8: float, low4: float) -> None:
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool

    def per_block(bits: int | None) -> int:
        pool = KVPool(2, 8, 16, 4, dim, dim, getattr(mx, dtype), fmt=fmt(bits))
        return pool.bytes_per_block

    full, eight, four = per_block(None), per_block(8), per_block(4)
    assert full / eight >= low8 and full / four >= low4, (full, eight, four)


def test_a_fixed_budget_holds_as_many_more_contexts(small_model: Path) -> None:
    """The worker's own sizing (``build.build_runner``) from one ``--kv-cache-gb``."""
    import mlx_lm

    from mlxd.config import CacheConfig, WorkerConfig
    from mlxd.worker.build import build_runner

    model = mlx_lm.load(str(small_model))[0]

    def blocks(bits: int | None) -> int:
        cache = CacheConfig(kv_cache_gb=0.01, kv_bits=bits)
        config = WorkerConfig(
            model=str(small_model), name="small", endpoint="ipc:///x", cache=cache
        )
        runner, pool, _ = build_runner(model, {2}, config, 4096)
        assert pool is not None and runner.pool.fmt.bits == bits  # type: ignore[attr-defined]
        return pool.num_blocks

    full, eight, four = blocks(None), blocks(8), blocks(4)
    # float32 on the CPU: 256 bytes a head row, 72 at 8 bits, 40 at 4
    assert eight / full >= 3.4 and four / full >= 6.0, (full, eight, four)


def test_a_group_that_does_not_divide_head_dim_is_refused(small_model: Path) -> None:
    import mlx_lm

    from mlxd.config import CacheConfig, WorkerConfig
    from mlxd.errors import ConfigError
    from mlxd.worker.build import build_runner

    model = mlx_lm.load(str(small_model))[0]
    config = WorkerConfig(
        model="m",
        name="small",
        endpoint="ipc:///x",
        cache=CacheConfig(kv_bits=8, kv_group_size=128),
    )
    with pytest.raises(ConfigError, match="kv-group-size 128 does not divide"):
        build_runner(model, {2}, config, 4096)


def test_models_on_their_own_caches_warn_and_keep_float_kv(
    small_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import mlx_lm

    from mlxd.config import CacheConfig, WorkerConfig
    from mlxd.worker.build import build_runner

    model = mlx_lm.load(str(small_model))[0]
    config = WorkerConfig(
        model="m", name="small", endpoint="ipc:///x", cache=CacheConfig(kv_bits=8, paged=False)
    )
    with caplog.at_level(logging.WARNING):
        _, pool, _ = build_runner(model, {2}, config, 4096)
    assert pool is None and "--kv-bits applies to the paged KV pool only" in caplog.text


def _alone(harness: Any, bits: int | None) -> list[Any]:
    """Each prompt in a fresh engine: no prefix hit, no batch. Results with their logprobs."""
    out = []
    for p in PROMPTS:
        h = harness(block_size=16, kv_format=fmt(bits))
        h.generate("a", p, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=True, top_logprobs=2)
        out.append(h.run()["a"])
    return out


def _together(h: Harness, staggered: bool = False) -> list[list[int]]:
    """Every prompt in one engine, after a warm-up that puts the system prompt in the prefix
    cache; ``staggered``: one arriving every few steps, so batches change under decode."""
    h.generate("warm", SYSTEM + "Hi.", max_tokens=2)
    h.run()
    for i, p in enumerate(PROMPTS):
        h.generate(str(i), p, max_tokens=MAX_TOKENS, ignore_eos=True)
        if staggered:
            h.step(3)
    res = h.run()
    assert all(res[str(i)].finished.usage.cached_tokens > 0 for i in range(len(PROMPTS)))
    assert sequences_hold_no_blocks(h)
    return [res[str(i)].token_ids for i in range(len(PROMPTS))]


# Two tokens this close in log probability are a tie the arithmetic decides: a batched matmul
# (OpenBLAS picks kernels by shape and CPU) rounds differently from a lone one, and at 4 bits a
# rounding can move a value across a quantization step.
TIE = 0.05


def _same_up_to_a_tie(outputs: list[list[int]], alone: list[Any]) -> bool:
    """Each output is the lone one's, or parts from it only where the lone one's two most
    likely tokens were a tie (``TIE``)."""
    for got, ref in zip(outputs, alone, strict=True):
        assert len(got) == len(ref.token_ids)
        at = next(
            (i for i, (a, b) in enumerate(zip(got, ref.token_ids, strict=True)) if a != b), None
        )
        if at is None:
            continue
        top = ref.logprobs[at].top_logprobs
        if top[0].logprob - top[1].logprob >= TIE:
            return False
    return True


@pytest.mark.parametrize("bits", [8, 4])
def test_prefix_hits_preemption_and_speculation_are_exact_within_the_mode(
    harness: Any, bits: int
) -> None:
    cold = _alone(harness, bits)
    float_kv = [r.token_ids for r in _alone(harness, None)]
    assert [r.token_ids for r in cold] != float_kv or bits == 8  # 4 bits change this output
    cases: dict[str, dict[str, Any]] = {
        "view": {},
        "gathered": {"max_view_tokens": 0},
        "view hand-over": {"max_view_tokens": 300},
        "preempting": {"num_blocks": 24, "block_size": 8},
        "speculating": {"speculate": "ngram"},
    }
    for name, kw in cases.items():
        kw = {"block_size": 16, "max_num_seqs": 6, **kw}
        h = harness(kv_format=fmt(bits), **kw)
        assert _same_up_to_a_tie(_together(h, staggered=True), cold), name
        if name == "preempting":
            assert h.engine.scheduler.kv_report().preemptions > 0


def test_the_disk_tier_round_trips_quantized_blocks(harness: Any, tmp_path: Path) -> None:
    import mlx.core as mx

    from mlxd.worker.prefix.disk_cache import DiskKVCache
    from mlxd.worker.prefix.disk_tier import DiskTier

    h = harness(block_size=16, kv_format=fmt(4))
    h.generate("a", PROMPTS[0], max_tokens=4, ignore_eos=True)
    h.run()
    runner = h.engine.runner
    pool = runner.pool
    assert pool.keys[0][0].dtype == mx.uint32  # packed words, scales, biases
    tier = DiskTier(DiskKVCache(tmp_path, "m", 1 << 30), runner)
    tier.save([(b"d" * 32, b"p" * 32, tuple(range(16)), 0)])
    assert tier.load([(b"d" * 32, b"p" * 32, tuple(range(16)), 5)]) == 1
    for a in pool.arrays:
        assert mx.array_equal(a[0:16], a[80:96]).item()
    assert any(a[0:16].abs().sum().item() > 0 for a in pool.arrays)


def test_the_pools_blocks_take_what_the_daemons_footprint_counts(small_model: Path) -> None:
    """One KV sizing rule (models/kv_layout.py): a block of the worker's pool (its arrays as
    allocated: packed words, scales and biases) takes what the daemon's footprint counts from
    config.json, float and quantized."""
    import json

    import mlx_lm

    from mlxd.daemon.footprint import kv_bytes_per_token
    from mlxd.worker.kv.paged_cache import KVPool

    model = mlx_lm.load(str(small_model))[0]  # in the file's dtype: the footprint's growth is 1
    config = json.loads((small_model / "config.json").read_text())
    for bits in (None, 8, 4):
        pool = KVPool.for_model(model, num_blocks=4, block_size=16, fmt=fmt(bits))
        assert pool.bytes_per_block == 16 * kv_bytes_per_token(config, bits=bits), bits
