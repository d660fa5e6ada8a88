"""The padded attention lengths and rows (``attention_shapes``): never shorter, little longer, few;
queries padded inside an attention call give the exact call's output."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
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


def _attend_recording(seen: list[int], keys: list[int] | None = None) -> Any:
    def attend(q: mx.array, k: mx.array, v: mx.array, **kwargs: Any) -> mx.array:
        seen.append(q.shape[-2])
        if keys is not None:
            keys.append(k.shape[-2])
        return mx.fast.scaled_dot_product_attention(q, k, v, **kwargs)

    return attend


@pytest.mark.usefixtures("bucketed")
@pytest.mark.parametrize("kind", ["bool", "additive", "one_row"])
@pytest.mark.parametrize(("n", "keys"), [(3, 48), (5, 48), (17, 48), (37, 48), (37, 37), (5, 5)])
def test_padded_attention_equals_exact_attention(kind: str, n: int, keys: int) -> None:
    """Queries and keys padded inside the call: planned lengths reach attention, the output is
    the exact call's, every value finite."""
    q = mx.random.normal((2, 4, n, 16), key=mx.random.key(n))
    k = mx.random.normal((2, 2, keys, 16), key=mx.random.key(n + 1))
    v = mx.random.normal((2, 2, keys, 16), key=mx.random.key(n + 2))
    sees = mx.arange(keys)[None, :] <= (mx.arange(n)[:, None] + keys - n)  # causal, at the end
    sees = mx.broadcast_to(sees, (2, 1, n, keys))
    if kind == "additive":
        mask = mx.where(sees, 0.0, -1e9).astype(mx.float32)
    elif kind == "one_row":
        mask = sees[:, :, -1:, :]
    else:
        mask = sees
    seen: list[int] = []
    seen_keys: list[int] = []
    padded = attention_shapes.padded_attention(_attend_recording(seen, seen_keys))
    out = padded(q, k, v, scale=0.25, mask=mask)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    assert seen == [attention_shapes.queries(n)] and seen[0] > n
    assert seen_keys == [attention_shapes.queries(keys)]
    assert mx.all(mx.isfinite(out)).item()
    assert out.shape == exact.shape
    assert mx.allclose(out, exact, atol=1e-5).item()


@pytest.mark.usefixtures("bucketed")
def test_padded_attention_leaves_other_calls_alone() -> None:
    """One query, a planned length already, or a mask given as a string or not at all."""
    q8 = mx.zeros((1, 2, 8, 16))
    q5 = mx.zeros((1, 2, 5, 16))
    kv = mx.zeros((1, 2, 8, 16))
    seen: list[int] = []
    padded = attention_shapes.padded_attention(_attend_recording(seen))
    padded(q8, kv, kv, scale=1.0, mask=mx.ones((8, 8), dtype=mx.bool_))
    padded(q5, kv, kv, scale=1.0, mask="causal")
    padded(q5, kv, kv, scale=1.0, mask=None)
    padded(q5[:, :, :1], kv, kv, scale=1.0, mask=mx.ones((1, 8), dtype=mx.bool_))
    assert seen == [8, 5, 5, 1]


def test_install_wraps_once_and_only_where_plans_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = mx.fast.scaled_dot_product_attention
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", original)
    monkeypatch.setattr(attention_shapes, "BUCKETED", False)
    assert not attention_shapes.install()
    assert mx.fast.scaled_dot_product_attention is original
    monkeypatch.setattr(attention_shapes, "BUCKETED", True)
    assert attention_shapes.install()
    assert not attention_shapes.install()  # wrapped once
    assert mx.fast.scaled_dot_product_attention is not original
    assert attention_shapes.uninstall()  # a benchmark's yardstick: mlx-lm's attention as shipped
    assert mx.fast.scaled_dot_product_attention is original
    assert not attention_shapes.uninstall()


@pytest.mark.usefixtures("bucketed")
def test_batch_rows_pad_to_a_power_of_two() -> None:
    assert [attention_shapes.batch(n) for n in range(1, 18)] == (
        [1, 2, 4, 4, 8, 8, 8, 8] + [16] * 8 + [32]
    )


@pytest.mark.usefixtures("bucketed")
@pytest.mark.parametrize("kind", ["per_row", "broadcast", "causal"])
@pytest.mark.parametrize("b", [3, 12])
def test_a_burst_split_by_arrival_reaches_attention_as_planned_rows(kind: str, b: int) -> None:
    """A prefill forward of 3 or 12 rows (a burst split by arrival) runs attention with 4 or 16
    rows, whose plans warm-up built; the padding rows are cut off and change no output."""
    n, keys = 5, 9
    q = mx.random.normal((b, 4, n, 16), key=mx.random.key(b))
    k = mx.random.normal((b, 2, keys, 16), key=mx.random.key(b + 1))
    v = mx.random.normal((b, 2, keys, 16), key=mx.random.key(b + 2))
    sees = mx.arange(keys)[None, :] <= (mx.arange(n)[:, None] + keys - n)
    mask: Any = {"per_row": mx.broadcast_to(sees, (b, 1, n, keys)), "broadcast": sees}.get(
        kind, "causal"
    )
    rows: list[int] = []

    def attend(q: mx.array, k: mx.array, v: mx.array, **kwargs: Any) -> mx.array:
        rows.append(q.shape[0])
        return mx.fast.scaled_dot_product_attention(q, k, v, **kwargs)

    out = attention_shapes.padded_attention(attend)(q, k, v, scale=0.25, mask=mask)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    assert rows == [attention_shapes.batch(b)] and rows[0] > b
    assert out.shape == exact.shape
    assert mx.allclose(out, exact, atol=1e-5).item()


def _qkv(b: int, n: int, keys: int) -> tuple[mx.array, mx.array, mx.array]:
    q = mx.random.normal((b, 4, n, 16), key=mx.random.key(n))
    k = mx.random.normal((b, 2, keys, 16), key=mx.random.key(n + 1))
    return q, k, mx.random.normal((b, 2, keys, 16), key=mx.random.key(n + 2))


@pytest.mark.parametrize(
    "kind", ["none", "causal", "bool", "additive", "per_head", "per_head_3d", "2d"]
)
@pytest.mark.parametrize(("n", "keys"), [(5, 9), (7, 7), (3, 40)])
def test_plain_attention_equals_the_fast_op(kind: str, n: int, keys: int) -> None:
    """Grouped query heads, every mask form a model passes (a mask per head too, 4-D or 3-D):
    the plain ops' output is the fast op's."""
    q, k, v = _qkv(2, n, keys)
    sees = mx.arange(keys)[None, :] <= (mx.arange(n)[:, None] + keys - n)
    per_row = mx.broadcast_to(sees, (2, 1, n, keys))
    first = mx.arange(keys) == 0  # every query sees key 0; each head sees its own others
    heads = sees & ((mx.random.uniform(shape=(2, 4, n, keys), key=mx.random.key(7)) > 0.4) | first)
    mask: Any = {
        "none": None,
        "causal": "causal",
        "bool": per_row,
        "additive": mx.where(per_row, 0.0, -mx.inf),
        "per_head": heads,
        "per_head_3d": heads[0],
        "2d": sees,
    }[kind]
    out = attention_shapes.plain_attention(q, k, v, 0.25, mask)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    assert out.shape == exact.shape
    assert mx.allclose(out, exact, atol=1e-5).item()


@pytest.mark.parametrize("dtype", [mx.bool_, mx.float32])
def test_plain_attention_keeps_a_query_that_sees_no_key_finite(dtype: Any) -> None:
    """A padding query (left-padded rows) sees no key: finite output, the others unchanged."""
    q, k, v = _qkv(1, 4, 6)
    sees = mx.array([[False] * 6] + [[True] * 6] * 3)[None, None]
    mask = sees if dtype == mx.bool_ else mx.where(sees, 0.0, -mx.inf)
    out = attention_shapes.plain_attention(q, k, v, 0.25, mask)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    assert mx.all(mx.isfinite(out)).item()
    assert mx.allclose(out[:, :, 1:], exact[:, :, 1:], atol=1e-5).item()


@pytest.mark.usefixtures("bucketed")
def test_after_warm_up_a_new_shape_with_few_scores_builds_no_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before ``freeze`` every shape reaches attention (warm-up builds its plans); after it, a
    shape warm-up built still does, and so does a new one with many scores, but a new one with
    few runs as plain ops, with the same output."""
    seen: list[int] = []
    padded = attention_shapes.padded_attention(_attend_recording(seen))
    built, new = _qkv(1, 16, 16), _qkv(1, 8, 24)
    mask = "causal"
    padded(*built, scale=0.25, mask=mask)
    assert seen == [16]
    attention_shapes.freeze()
    padded(*built, scale=0.25, mask=mask)
    out = padded(*new, scale=0.25, mask=mask)
    assert seen == [16, 16]  # the new shape ran as plain ops
    exact = mx.fast.scaled_dot_product_attention(*new, scale=0.25, mask=mask)
    assert mx.allclose(out, exact, atol=1e-5).item()
    monkeypatch.setattr(attention_shapes, "PLAIN_SCORES", 4 * 8 * 24 - 1)
    padded(*new, scale=0.25, mask=mask)
    assert seen == [16, 16, 8]  # too many scores: its plan is built
