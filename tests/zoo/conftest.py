"""One real daemon serving many zoo models (lazily loaded, evicted under --max-memory), the
in-process mlx-lm models it is compared with, and the MODELS.md table the tier can write.

Part of the whole suite (``scripts/test``); alone: ``scripts/test tests/zoo``; left out with
``-m "not zoo"``. ``MLXD_ZOO_ARCHS=all`` (or a comma list) picks the archs; the default leaves
out ``LIKE_QWEN3`` and ``LIKE_GEMMA3``. ``MLXD_ZOO_WRITE_DOCS=1``
rewrites docs/MODELS.md from what the run saw.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Daemon, free_port, stop_daemon, wait_healthy

# Plain-KVCache archs the paged pool serves as it serves qwen3 (all checks passed on 2026-11-24):
# left out of the default run to keep it near 5 minutes; MLXD_ZOO_ARCHS=all runs them too.
LIKE_QWEN3 = (
    "Klear",
    "apertus",
    "bailing_moe",
    "cohere",
    "dbrx",
    "deepseek",
    "deepseek_v2",
    "dots1",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone",
    "gemma",
    "glm",
    "glm4",
    "glm4_moe",
    "gpt_neox",
    "gptj",
    "granite",
    "granitemoe",
    "helium",
    "hunyuan_v1_dense",
    "internlm2",
    "internlm3",
    "kimi_k25",
    "kimi_vl",
    "lille-130m",
    "llama4_text",
    "mimo",
    "minicpm",
    "minicpm3",
    "minimax",
    "mistral4",
    "nanochat",
    "nemotron",
    "olmo2",
    "olmoe",
    "openelm",
    "phi3",
    "phimoe",
    "phixtral",
    "plamo",
    "qwen",
    "qwen2",
    "qwen2_moe",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "seed_oss",
    "smollm3",
    "solar_open",
    "stablelm",
    "starcoder2",
    "talkie",
    "telechat3",
    "youtu_llm",
)
# Window archs the window runner pages as it pages gemma3 (plain and sliding-window layers of
# one size; all checks passed on 2026-11-26, stop 34): left out of the default run with
# LIKE_QWEN3 to keep the suite under 20 minutes; gemma3, gemma3_text, gemma4_text, gpt_oss
# (sinks), cohere2, olmo3, exaone4, mimo_v2_flash, step3p5 and llama stay in it.
LIKE_GEMMA3 = (
    "afmoe",
    "exaone_moe",
    "gear",
    "gemma4",
    "iquestloopcoder",
    "laguna",
    "mellum",
    "ministral3",
    "muse_glimmer",
    "spark2_5",
)
BLOCK_SIZE = 16
POOL_BLOCKS = 24  # 384 tokens: one long request fits, four of them preempt
WINDOW_SLABS = 14  # a window model's slabs beside them: one long prompt's, prefilled at once
DOCS = Path(__file__).resolve().parents[2] / "docs" / "MODELS.md"


def selected_archs() -> tuple[str, ...]:
    from mlxd.models.zoo import UNSTABLE, archs

    chosen = os.environ.get("MLXD_ZOO_ARCHS", "")
    stable = tuple(a for a in archs() if a not in UNSTABLE)
    if chosen == "all":
        return stable
    return tuple(a for a in chosen.split(",") if a) or tuple(
        a for a in stable if a not in LIKE_QWEN3 + LIKE_GEMMA3
    )


@functools.cache
def corpus_ids(tokenizer_dir: str) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir, model_max_length=10**6)
    ids: list[int] = tok.encode(Path(textwrap.__file__).read_text())
    return ids


@dataclass
class Zoo:
    """The daemon, the models' directories, and what the checks saw (for MODELS.md): per arch,
    ``kv_cache`` (the worker's description), each check's outcome, and facts such as
    ``preemptions``."""

    daemon: Daemon
    dirs: dict[str, Path]
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.daemon.base_url}{path}"

    def describe(self, arch: str, kv_cache: str) -> None:
        self.record_fact(arch, "kv_cache", kv_cache)

    def record_fact(self, arch: str, key: str, value: Any) -> None:
        self.seen.setdefault(arch, {})[key] = value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    if report.when == "call" and isinstance(funcargs.get("zoo"), Zoo):
        check = getattr(item, "originalname", item.name)
        if hasattr(report, "wasxfail"):  # a known failure (test_zoo.KNOWN), or not this run
            result = "known" if report.skipped else "ok"
        elif report.skipped:
            result = "skipped"
        else:
            error = "" if report.passed else str(call.excinfo.value if call.excinfo else "failed")
            result = error.splitlines()[0] if error else "ok"
        funcargs["zoo"].record_fact(funcargs["arch"], check, result)


@functools.cache
def load(path: Path) -> tuple[Any, Any]:
    import mlx_lm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mlx_lm.load(str(path))[:2]  # type: ignore[return-value]


def greedy(path: Path, prompt: list[int], num_tokens: int) -> str:
    """mlx-lm's own greedy continuation of ``prompt`` up to EOS, as text (its streaming
    detokenizer, as ``mlx_lm.generate`` prints it)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, tokenizer = load(path)
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=num_tokens):
        if int(token) in tokenizer.eos_token_ids:
            break
        detokenizer.add_token(int(token))
    detokenizer.finalize()
    return str(detokenizer.text)


def is_windowed(path: Path) -> bool:
    """Whether the model's window layers go in slabs (``runners.window``)."""
    from mlxd.worker.kv import layer_caches

    model, _ = load(path)
    return bool(layer_caches.window_size(model))


def pool_gb(path: Path) -> float:
    """A KV budget of POOL_BLOCKS blocks for this model (its paged pool, or snapshot cache)."""
    from mlxd.config import STATE_SHARE, VIEW_SHARE
    from mlxd.worker.kv import layer_caches
    from mlxd.worker.runners.paged import check_model_supported

    model, _ = load(path)
    hybrid = layer_caches.is_hybrid(model)  # its recurrent states' share on top (2+ fit)
    window = layer_caches.window_size(model)  # blocks of every layer: slabs go back
    if not check_model_supported(model) or hybrid or window:
        from mlxd.knobs import MAX_NUM_SEQS
        from mlxd.worker.kv.paged_cache import KVPool

        per_token = KVPool.bytes_per_token(model)
        if window:  # one long request's window slabs beside the blocks (its whole prompt)
            per_token += KVPool.bytes_per_token(model, windows=True) * WINDOW_SLABS / POOL_BLOCKS
        pool = per_token * POOL_BLOCKS * BLOCK_SIZE / (1 - VIEW_SHARE)
        if not hybrid:
            return pool / 2**30
        rows = 2 * MAX_NUM_SEQS.default * layer_caches.state_bytes(model)  # the worker's reserve
        return (pool + rows) / (1 - STATE_SHARE) / 2**30
    # A model on its own caches: per token (K/V, growing 256 tokens at a time) and per
    # sequence (recurrent state, windows), measured. Its budget is split in half, the batch's
    # caches and the snapshots: each half holds POOL_BLOCKS blocks of K/V and three sequences'
    # state, so four long requests preempt and two snapshots fit.
    import mlx.core as mx

    sizes = []
    for n in (256, 512):
        caches = layer_caches.model_caches(model)
        model(mx.zeros((1, n), dtype=mx.int32), cache=caches)
        sizes.append(layer_caches.nbytes(caches))
    per_token = (sizes[1] - sizes[0]) / 256
    per_sequence = sizes[0] - 256 * per_token
    return 2 * (per_token * POOL_BLOCKS * BLOCK_SIZE + 3 * per_sequence) / 2**30


def _write_config(root: Path, dirs: dict[str, Path]) -> Path:
    lines = ['keep_alive = "0"', ""]
    for arch, path in dirs.items():
        lines += [
            f'[models."{arch}"]',
            f'path = "{path}"',
            "preload = false",
            'dtype = "file"',
            f"kv_cache_gb = {pool_gb(path):.9f}",
            "",
        ]
    config = root / "zoo.toml"
    config.write_text("\n".join(lines))
    return config


def _start(config: Path, log: Any) -> Daemon:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--config",
        str(config),
        "--port",
        str(port),
        "--max-memory",
        "1200MB",
        "--kv-block-size",
        str(BLOCK_SIZE),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=log)
    return wait_healthy(Daemon(proc, f"http://127.0.0.1:{port}", "", config))


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zoo]:
    from mlxd.models.zoo import make_zoo_model

    root = tmp_path_factory.mktemp("zoo")
    dirs = {arch: make_zoo_model(root / arch, arch) for arch in selected_archs()}
    with (root / "daemon.log").open("wb") as log:
        z = Zoo(_start(_write_config(root, dirs), log), dirs)
        try:
            yield z
        finally:
            if z.daemon.proc.poll() is None:
                stop_daemon(z.daemon)
    if os.environ.get("MLXD_ZOO_WRITE_DOCS") == "1":
        from tests.zoo.models_doc import write_models_doc

        write_models_doc(DOCS, z.dirs, z.seen)
