"""Gated DeltaNet prefill in chunks (``runners.delta_chunks``) against mlx-lm's own per-token
loop: the same outputs and state for any length, head grouping, starting state and dtype; and
``install`` routes a real model's prefill through it (on the CPU, where Metal is absent) while
decode keeps mlx-lm's step."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import pytest

pytestmark = pytest.mark.model


def _inputs(t: int, hk: int, hv: int, dk: int, dv: int, dtype: Any, seed: int) -> dict[str, Any]:
    from mlx_lm.models.gated_delta import compute_g

    mx.random.seed(seed)
    q, k = (mx.random.normal((2, t, hk, dk)) for _ in range(2))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    a, b = mx.random.normal((2, t, hv)), mx.random.normal((2, t, hv))
    g = compute_g(mx.random.normal((hv,)), a, mx.random.normal((hv,)))
    state = mx.random.normal((2, hv, dv, dk)) * 0.1
    v = mx.random.normal((2, t, hv, dv))
    cast = {"q": q, "k": k, "v": v}
    return {
        **{n: x.astype(dtype) for n, x in cast.items()},
        "g": g,
        "beta": mx.sigmoid(b),
        "state": state,
    }


@pytest.mark.parametrize(
    ("t", "hk", "hv", "dk", "dv"),
    [(64, 2, 2, 16, 16), (100, 2, 4, 16, 32), (1, 2, 2, 16, 16), (257, 4, 8, 32, 16)],
)
def test_chunks_equal_the_per_token_loop(t: int, hk: int, hv: int, dk: int, dv: int) -> None:
    from mlx_lm.models.gated_delta import gated_delta_ops

    from mlxd.worker.runners.delta_chunks import chunked_gated_delta

    x = _inputs(t, hk, hv, dk, dv, mx.float32, seed=t)
    y_loop, s_loop = gated_delta_ops(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    y, s = chunked_gated_delta(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    assert y.shape == y_loop.shape and y.dtype == y_loop.dtype and s.shape == s_loop.shape
    assert mx.allclose(y, y_loop, atol=1e-5).item() and mx.allclose(s, s_loop, atol=1e-5).item()


def test_bfloat16_inputs_agree_to_their_precision() -> None:
    from mlx_lm.models.gated_delta import gated_delta_ops

    from mlxd.worker.runners.delta_chunks import chunked_gated_delta

    x = _inputs(130, 2, 2, 32, 32, mx.bfloat16, seed=1)
    y_loop, s_loop = gated_delta_ops(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    y, s = chunked_gated_delta(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    assert y.dtype == mx.bfloat16 and s.dtype == mx.float32
    assert mx.allclose(y.astype(mx.float32), y_loop.astype(mx.float32), atol=2e-2).item()
    assert mx.allclose(s, s_loop, atol=1e-4).item()


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # its tokenizer
def test_install_routes_a_models_prefill_through_chunks_and_keeps_decode(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny Qwen3.5 (Gated DeltaNet and attention layers): after ``install`` a 300-token
    prompt's prefill runs in chunks, a one-token decode step does not, and the logits of both
    equal those of mlx-lm's loop."""
    import importlib

    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load

    from mlxd.models.zoo import make_zoo_model
    from mlxd.worker.runners import delta_chunks

    model, _ = load(str(make_zoo_model(tmp_path / "m", "qwen3_5")))
    module = importlib.import_module(type(model).__module__)
    monkeypatch.setattr(module, "gated_delta_update", module.gated_delta_update)  # undone after
    prompt = mx.array([[(7 * i) % 200 + 3 for i in range(300)]])

    def run() -> tuple[mx.array, mx.array]:
        cache = make_prompt_cache(model)
        first = model(prompt, cache=cache)[:, -1]
        return first, model(mx.array([[5]]), cache=cache)[:, -1]

    expected = run()
    assert delta_chunks.install(model) >= 1
    assert delta_chunks.install(model) == 0  # a module is patched once
    lengths: list[int] = []
    chunked = delta_chunks.chunked_gated_delta
    monkeypatch.setattr(
        delta_chunks, "chunked_gated_delta", lambda *a: lengths.append(a[0].shape[1]) or chunked(*a)
    )
    got = run()
    assert lengths and set(lengths) == {300}  # every layer's prefill; no decode step
    lengths.clear()
    for n in (delta_chunks.MIN_TOKENS - 1, delta_chunks.MIN_TOKENS):
        model(prompt[:, :n], cache=make_prompt_cache(model))
    assert set(lengths) == {delta_chunks.MIN_TOKENS}  # shorter spans keep the loop
    for want, have in zip(expected, got, strict=True):
        assert mx.allclose(want, have, atol=1e-4).item()
    chunked_update = module.gated_delta_update
    assert delta_chunks.uninstall() >= 1  # mlx-lm's loop back, as a benchmark's yardstick runs
    assert module.gated_delta_update is not chunked_update
    assert module.gated_delta_update.__module__ == "mlx_lm.models.gated_delta"
    lengths.clear()
    run()
    assert not lengths and delta_chunks.uninstall() == 0


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # its tokenizer
def test_for_this_process_patches_and_undoes_a_hybrids_functions(tmp_path: Any) -> None:
    """``for_this_process`` (the worker's and ``mlxd bench engine``'s) chunks a hybrid's gated
    delta prefill where Metal is absent and pads attention only where plans are built (CUDA);
    ``undo`` leaves mlx-lm's functions as they ship."""
    import importlib

    from mlx_lm.utils import load

    from mlxd.models.zoo import make_zoo_model
    from mlxd.worker.kv import attention_shapes
    from mlxd.worker.runners.served import for_this_process

    model, _ = load(str(make_zoo_model(tmp_path / "m", "qwen3_5")))
    module = importlib.import_module(type(model).__module__)
    shipped, attention = module.gated_delta_update, mx.fast.scaled_dot_product_attention
    patched = for_this_process(model)
    try:
        assert (patched.delta_modules >= 1) == (not mx.metal.is_available())
        assert patched.padded_attention == attention_shapes.BUCKETED
        assert (module.gated_delta_update is not shipped) == (patched.delta_modules >= 1)
    finally:
        patched.undo()
    assert module.gated_delta_update is shipped
    assert mx.fast.scaled_dot_product_attention is attention


def test_the_blocked_inverse_equals_forward_substitution() -> None:
    """(I + a)^-1 by doubling diagonal blocks against row-by-row substitution, for the
    strictly lower matrices a chunk makes (entries up to 1) and larger ones."""
    from mlxd.worker.runners.delta_chunks import CHUNK, _unit_lower_inverse

    for scale, seed in ((0.1, 1), (1.0, 2)):
        a = mx.tril(mx.random.normal((2, 3, 2, CHUNK, CHUNK), key=mx.random.key(seed)), -1)
        a = a * scale
        t = -a
        for i in range(1, CHUNK):
            t[..., i, :i] = t[..., i, :i] + (t[..., i, :i, None] * t[..., :i, :i]).sum(-2)
        want = t + mx.eye(CHUNK)
        got = _unit_lower_inverse(a)
        assert mx.allclose(got, want, rtol=1e-4, atol=1e-5 * mx.abs(want).max().item()).item()


def test_mlx_vlm_keeps_its_scan_with_the_blocked_inverse(tmp_path: Any) -> None:
    """mlx-vlm's Qwen3.5 layers call mlx-vlm's own ``gated_delta_update`` (a chunked scan where
    Metal is absent already, whose cache holds the state): ``install`` leaves it, gives its
    chunks the blocked inverse, and the language model's logits over a prompt agree."""
    pytest.importorskip("mlx_vlm")
    from mlx_vlm import load
    from mlx_vlm.models.qwen3_5 import gated_delta as vlm_scan

    from mlxd.models.vlm_maker import make_vlm
    from mlxd.worker.runners import delta_chunks

    model, _ = load(str(make_vlm(tmp_path / "vl", arch="qwen3_5_vl", progress=lambda _: None)))
    lm = model.language_model
    ids = mx.array([[(13 * i) % 200 + 5 for i in range(150)]])
    scan, inverse = vlm_scan.gated_delta_update, vlm_scan._invert_unit_lower
    want = lm(ids, cache=lm.make_cache()).logits
    try:
        assert delta_chunks.install(model) == 1
        assert vlm_scan._invert_unit_lower is not inverse
        assert vlm_scan.gated_delta_update is scan
        assert delta_chunks.install(model) == 0  # once
        got = lm(ids, cache=lm.make_cache()).logits
    finally:
        vlm_scan._invert_unit_lower = inverse
    assert mx.allclose(got, want, atol=1e-4).item()


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_the_inverses_lower_quarters_are_each_diagonal_blocks(
    lead: tuple[int, ...], transposed: bool
) -> None:
    """The strided view the blocked inverse reads: each 2s-block's lower-left s x s quarter, for
    any number of leading dimensions, of a matrix laid out in rows or not (a transposed view)."""
    from mlxd.worker.runners.delta_chunks import _lower_quarters

    a = mx.arange(64 * math.prod(lead), dtype=mx.float32).reshape(*lead, 8, 8)
    if transposed:
        a = a.swapaxes(-1, -2)
    for s in (1, 2, 4):
        blocks = [
            a[..., i * 2 * s + s : (i + 1) * 2 * s, i * 2 * s : i * 2 * s + s]
            for i in range(8 // (2 * s))
        ]
        assert mx.array_equal(_lower_quarters(a, s), mx.stack(blocks, axis=-3)).item()
