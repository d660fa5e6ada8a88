"""The padded attention lengths (``attention_shapes``): never shorter, little longer, few."""

from __future__ import annotations

import pytest

from mlxd.worker.kv import attention_shapes


@pytest.fixture
def bucketed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_shapes, "BUCKETED", True)


def test_exact_where_no_plans_are_built() -> None:
    if attention_shapes.BUCKETED:
        pytest.skip("this backend pads")
    assert [attention_shapes.queries(n) for n in (1, 5, 77)] == [1, 5, 77]
    assert attention_shapes.key_blocks(77, multi_query=True) == 77


@pytest.mark.usefixtures("bucketed")
def test_queries_pad_to_few_lengths() -> None:
    assert [attention_shapes.queries(n) for n in range(1, 18)] == (
        [1, 2, 4, 4, 8, 8, 8, 8] + [16] * 8 + [20]
    )
    for n in range(17, 5000):
        q = attention_shapes.queries(n)
        assert n <= q <= 1.25 * n
    assert {attention_shapes.queries(n) for n in range(1025, 2049)} == {1280, 1536, 1792, 2048}


@pytest.mark.usefixtures("bucketed")
def test_key_blocks_pad_only_multi_query_steps() -> None:
    for n in range(1, 3000):
        k = attention_shapes.key_blocks(n, multi_query=True)
        assert n <= k <= max(n, 1.25 * n)
        assert attention_shapes.key_blocks(n, multi_query=False) == n
    assert {attention_shapes.key_blocks(n, True) for n in range(65, 129)} == {80, 96, 112, 128}
    assert [attention_shapes.key_blocks(n, True) for n in (1, 2, 3, 5)] == [1, 2, 3, 5]
