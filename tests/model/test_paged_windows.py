"""Sliding-window layers on the paged pool (docs/decisions/0003): the pool holds their keys
like any layer's and each forward masks them to the window. A Mistral-3-shaped zoo model (an
8-token window on every other layer, plain caches) against mlx-lm's greedy output, on every
path a forward takes: a lone prompt (uniform, causal), prompts of different lengths prefilled
together (left-padded masks), decode from the read view and from the gathered blocks, a
prefix hit, and both verification forwards of speculation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxd.worker.runners import paged as paged_runner
from mlxd.worker.runners.paged import check_model_supported
from tests.model.conftest import Harness, harnesses, load_model
from tests.model.test_engine import reference_ids

pytestmark = [pytest.mark.model, pytest.mark.filterwarnings("ignore::FutureWarning")]

WORDS = (
    "the quick brown fox jumps over the lazy dog while a b c d e f a b c d e f "
    "hello world hello world and so on and on"
).split()


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.zoo import WINDOW, make_zoo_model

    path = make_zoo_model(tmp_path_factory.mktemp("windows") / "mistral3", "mistral3")
    model, _ = load_model(path)
    assert WINDOW == 8 and check_model_supported(model) == ""  # on the pool
    return path


@pytest.fixture
def harness(windowed: Path) -> Iterator[Callable[..., Harness]]:
    with harnesses(windowed) as make:
        yield make


def prompts(windowed: Path) -> list[list[int]]:
    """Prompts of 5 to 40 tokens, longer and shorter than the window, with no prefix in common:
    they prefill together (the shorter ones left-padded by more than the window)."""
    _, tok = load_model(windowed)
    return [tok.encode(" ".join(WORDS[i : i + n])) for i, n in ((0, 12), (3, 18), (6, 25), (9, 3))]


@pytest.mark.parametrize("kv", [{}, {"max_view_tokens": 0}], ids=["view", "gathered"])
def test_windowed_layers_on_the_pool_equal_mlx_lm(
    windowed: Path, harness: Callable[..., Harness], kv: dict[str, Any]
) -> None:
    h = harness(**kv)
    asks = prompts(windowed)
    for i, ids in enumerate(asks):  # prefilled together: different lengths, left-padded
        h.generate_ids(str(i), ids, max_tokens=20, ignore_eos=True)
    results = h.run()
    for i, ids in enumerate(asks):
        assert results[str(i)].token_ids == reference_ids(windowed, ids, 20), i


def test_one_row_decoding_from_the_gathered_blocks_is_windowed(
    windowed: Path, harness: Callable[..., Harness]
) -> None:
    """One row (every row as long: the read is trimmed to its tokens) with no view."""
    h = harness(max_view_tokens=0)
    ids = prompts(windowed)[2]
    h.generate_ids("a", ids, max_tokens=20, ignore_eos=True)
    assert h.run()["a"].token_ids == reference_ids(windowed, ids, 20)
    assert h.engine.runner.gathered_steps == 0  # no view by configuration, not for want of room


def test_a_prefix_hit_past_the_window_continues_as_cold(
    windowed: Path, harness: Callable[..., Harness]
) -> None:
    h = harness(block_size=8)
    ids = prompts(windowed)[2]
    h.generate_ids("a", ids, max_tokens=4, ignore_eos=True)
    h.run()
    h.generate_ids("b", ids + [7, 8, 9], max_tokens=12, ignore_eos=True)
    b = h.run()["b"]
    assert b.finished is not None and b.finished.usage.cached_tokens >= 16
    assert b.token_ids == reference_ids(windowed, ids + [7, 8, 9], 12)


@pytest.mark.parametrize("virtual_rows", [False, True], ids=["window", "rows"])
def test_speculation_verifies_windowed_layers_exactly(
    windowed: Path,
    harness: Callable[..., Harness],
    virtual_rows: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paged_runner, "VIRTUAL_ROWS", virtual_rows)
    h = harness(speculate="ngram")
    h.engine.speculator.adaptive = False  # every step with a draft verifies
    asks = prompts(windowed)[1:3]
    for i, ids in enumerate(asks):
        h.generate_ids(str(i), ids + ids, max_tokens=24, ignore_eos=True)  # repeats: drafts
    results = h.run()
    assert h.engine.speculator.counters.verify_steps > 0
    for i, ids in enumerate(asks):
        assert results[str(i)].token_ids == reference_ids(windowed, ids + ids, 24), i
