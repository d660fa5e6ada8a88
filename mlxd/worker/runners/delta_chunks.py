"""Gated DeltaNet prefill in chunks: a prompt's recurrence as a few matrix products per 64 tokens
where MLX has no fused kernel for it.

mlx-lm runs the gated delta rule (Qwen3.5, Qwen3-Next, OLMo hybrid, ...) through a Metal kernel
on Apple GPUs. Elsewhere (CUDA, the CPU) its ``gated_delta_ops`` steps a Python loop over every
token, some ten array operations a token and layer: on an H100 a 4.5k-token prompt of a
Qwen3.5-0.8B shape took 11.0 s in mlxd and 8.4-12.9 s in every peer (docs/PERFORMANCE.md, run
M1), against 0.13 s for a dense model of that size. ``chunked_gated_delta`` computes the same
recurrence chunk by chunk in the WY form of the Gated DeltaNet paper (as flash-linear-attention's
reference does): within a chunk the tokens' updates come from one triangular solve and a few
products, and only the state passes from chunk to chunk. ``install`` swaps it in for the
prefill of a loaded model's layers where Metal is absent; decode, prefills under ``MIN_TOKENS`` and
anything it does not cover (per-dimension gates, bounded or negative gates) keep mlx-lm's path.
A padding mask (rows padded after their tokens) makes the padding neither decay nor update.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

CHUNK = 64  # tokens a chunk: the triangular solve's size
# Shorter spans (a verification window, a few tokens after a prefix hit) keep mlx-lm's loop: some
# ten kernels a token and layer, against a chunk's fixed few hundred. Where kernels are launched
# one by one the loop costs more from a few dozen tokens on: on an H200, chunks from 64 tokens
# instead of 256 took a 128-token prompt's TTFT from 303 to 153 ms and 16 streams from 384-539
# to 904-1,085 tok/s, with the prompt's last 31 tokens (after its last block boundary) still in
# the loop; from 16, the steadiest of the two, 894-940 (docs/PERFORMANCE.md, runs HP1-HP2).
MIN_TOKENS = 16
_NAME = "gated_delta_update"  # what a model's module calls, imported by this name
# Whose function is replaced: mlx-lm's, which loops where Metal is absent. mlx-vlm's Qwen3.5
# brings its own (a chunked scan there already, and a cache-owning signature).
_LOOPS = "mlx_lm.models.gated_delta"
# mlx-vlm's scan inverts each chunk's unit lower-triangular matrix row by row (``_invert_unit_
# lower``); ``install`` gives it the blocked inverse: an H200 probe of a 352-token Qwen3.5 VLM
# prompt spent most of the prefill's host time launching that loop's kernels.
_VLM_FAMILY = "mlx_vlm.models.qwen3_5"
_VLM_SCAN = "mlx_vlm.models.qwen3_5.gated_delta"
_VLM_INVERSE = "_invert_unit_lower"
_replaced: list[tuple[Any, str, Any]] = []  # (module, attribute, original) of every install


def chunked_gated_delta(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """The gated delta rule over a prompt, as ``gated_delta_ops`` without a mask computes it.

    Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (the decay, in (0, 1]) and beta [B, T, Hv];
    state [B, Hv, Dv, Dk]. Returns y [B, T, Hv, Dv] in q's dtype and the last state (float32).
    """
    T, repeat, dtype = q.shape[1], v.shape[2] // q.shape[2], q.dtype
    if repeat > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    pad = -T % CHUNK
    q, k, v, beta = (_chunks(x, pad) for x in (q, k, v, beta))
    cum = mx.cumsum(_chunks(mx.log(g.astype(mx.float32)), pad), axis=-1)  # a padded g is 1
    u, w, qk = _within_chunks(q, k, v, beta, cum)
    starts, deltas, s = _across_chunks(u, w, k, cum, state.astype(mx.float32))
    q_decayed = q * mx.exp(cum)[..., None]
    y = q_decayed @ starts.swapaxes(-1, -2) + qk @ deltas  # every chunk's outputs at once
    y = mx.moveaxis(y, 1, 3)  # [B, n, C, H, Dv]
    return y.reshape(y.shape[0], -1, *y.shape[3:])[:, :T].astype(dtype), s


def _across_chunks(
    u: mx.array, w: mx.array, k: mx.array, cum: mx.array, s: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """The state from chunk to chunk: each chunk's starting state and update (delta = u - w S^T)
    [B, H, n, ...], and the last state. Only what the next chunk needs runs in the loop: four
    kernels and two copies into the stacks a chunk, where computing each chunk's outputs in it
    took nine (``bench/delta_kernels.py``); the outputs are two batched products after it."""
    k_to_end = k * mx.exp(cum[..., -1:] - cum)[..., None]
    end_decay = mx.exp(cum[..., -1])[..., None, None]  # [B, H, n, 1, 1]
    starts, deltas = [], []
    for c in range(u.shape[2]):  # [:, :, c] is a view; a leading integer index would gather
        delta = u[:, :, c] - w[:, :, c] @ s.swapaxes(-1, -2)
        starts.append(s)
        deltas.append(delta)
        s = mx.addmm(s * end_decay[:, :, c], delta.swapaxes(-1, -2), k_to_end[:, :, c])
    return mx.stack(starts, axis=2), mx.stack(deltas, axis=2), s


def install(model: Any) -> int:
    """Route the prefill of ``model``'s gated delta layers through ``chunked_gated_delta`` where
    Metal is absent, and give mlx-vlm's Qwen3.5 scan (which ``model``'s modules call instead of
    mlx-lm's function, left to them) the blocked chunk inverse; returns how many modules were
    patched (0 on Metal or without such layers). A module is patched once, for every model of
    its kind in this process."""
    if mx.metal.is_available():
        return 0
    modules = {type(m).__module__ for _, m in model.named_modules()}
    patched = _install_vlm_inverse(modules)
    for name in sorted(modules):
        module = sys.modules.get(name)
        original = getattr(module, _NAME, None)
        if getattr(original, "__module__", None) != _LOOPS:  # not mlx-lm's, or patched already
            continue
        _replace(module, _NAME, _chunked_update(original))
        patched += 1
    return patched


def uninstall() -> int:
    """Undo this process's ``install``s (a benchmark runs mlx-lm as it ships, then serves
    again); returns how many functions were put back."""
    count = len(_replaced)
    while _replaced:
        module, name, original = _replaced.pop()
        setattr(module, name, original)
    return count


# Internal helpers


def _install_vlm_inverse(modules: set[str]) -> int:
    """mlx-vlm's Qwen3.5 prefill (its own chunked scan, kept) with its chunks' triangular
    inverse by ``_unit_lower_inverse``: 1 when patched now."""
    scan = sys.modules.get(_VLM_SCAN)
    if not any(name.startswith(_VLM_FAMILY) for name in modules) or scan is None:
        return 0
    if getattr(scan, _VLM_INVERSE, None) in (None, _vlm_inverse):
        return 0
    _replace(scan, _VLM_INVERSE, _vlm_inverse)
    return 1


def _replace(module: Any, name: str, value: Any) -> None:
    _replaced.append((module, name, getattr(module, name)))
    setattr(module, name, value)


def _chunks(x: mx.array, pad: int) -> mx.array:
    """[B, T, H, ...] in float32, zero-padded to whole chunks, as [B, H, n, C, ...]."""
    x = x.astype(mx.float32)
    if pad:
        x = mx.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape(x.shape[0], -1, CHUNK, *x.shape[2:])
    return mx.moveaxis(x, 3, 1)


def _within_chunks(
    q: mx.array, k: mx.array, v: mx.array, beta: mx.array, cum: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """What a chunk's tokens contribute, whatever state it starts from: the value part ``u`` and
    the state's weights ``w`` of their updates (delta = u - w S^T), and the decayed q.k of each
    token with the earlier ones and itself."""
    gap = cum[..., :, None] - cum[..., None, :]  # [.., C, C]: the decay from token j to token i
    before, upto = _triangles()
    k_beta = k * beta[..., None]
    a = (k_beta @ k.swapaxes(-1, -2)) * mx.exp(mx.where(before, gap, -mx.inf))
    solve = _unit_lower_inverse(a)
    u = solve @ (v * beta[..., None])
    w = solve @ (k_beta * mx.exp(cum)[..., None])
    qk = (q @ k.swapaxes(-1, -2)) * mx.exp(mx.where(upto, gap, -mx.inf))
    return u, w, qk


@functools.cache
def _triangles() -> tuple[mx.array, mx.array]:
    """A chunk's strictly lower and lower triangles (True below, and on, the diagonal): built
    once, not five kernels each in every layer's every prefill."""
    ones = mx.ones((CHUNK, CHUNK), dtype=mx.bool_)
    triangles = mx.tril(ones, -1), mx.tril(ones)
    mx.eval(triangles)
    return triangles


def _unit_lower_inverse(a: mx.array) -> mx.array:
    """(I + a)^-1 for strictly lower-triangular ``a`` [.., C, C] (C a power of two), by
    diagonal blocks of doubling size: each level's new off-diagonal block is -X22 L21 X11 of the
    two inverted halves, a few batched products a level, log2(C) levels. A row-by-row forward
    substitution (as mlx-vlm's and mlx-lm's references run it) is as exact but launches C
    steps of kernels a layer, which on CUDA cost more than the chunk's arithmetic."""
    size, lead = a.shape[-1], a.shape[:-2]
    x = mx.ones((*lead, size, 1, 1), dtype=a.dtype)  # the 1 x 1 diagonal blocks' inverses
    s = 1
    while s < size:
        n = size // (2 * s)
        low = _lower_quarters(a, s)  # (.., n, s, s): each pair's L21
        pair = x.reshape(*lead, n, 2, s, s)
        x11, x22 = pair[..., 0, :, :], pair[..., 1, :, :]
        top = mx.concatenate([x11, mx.zeros_like(x11)], axis=-1)
        bottom = mx.concatenate([-(x22 @ low @ x11), x22], axis=-1)
        x = mx.concatenate([top, bottom], axis=-2)
        s *= 2
    return x.reshape(*lead, size, size)


def _lower_quarters(a: mx.array, s: int) -> mx.array:
    """The lower-left s x s quarter of each 2s x 2s block on the diagonal of ``a`` [.., C, C], as
    a strided view of it: (.., C / 2s, s, s). (``mx.diagonal`` gathers, a kernel and two index
    ranges a level on CUDA.) ``mx.as_strided`` reads ``a`` in row-major order, copied there
    first if it is not."""
    *lead, size, _ = a.shape
    strides, step = [], size * size
    for d in reversed(lead):
        strides.insert(0, step)
        step *= d
    shape = (*lead, size // (2 * s), s, s)
    return mx.as_strided(a, shape, (*strides, 2 * s * (size + 1), size, 1), offset=s * size)


def _vlm_inverse(t: mx.array, size: int) -> mx.array:
    """mlx-vlm's ``_invert_unit_lower(I + a, C)`` by ``_unit_lower_inverse``."""
    return _unit_lower_inverse(t - mx.eye(size, dtype=t.dtype))


def _chunked_update(original: Callable[..., Any]) -> Any:
    """``gated_delta_update`` with the prefill it covers chunked, the rest as before."""
    from mlx_lm.models.gated_delta import compute_g  # the one ``original`` uses (``_LOOPS``)

    def update(
        q: mx.array,
        k: mx.array,
        v: mx.array,
        a: mx.array,
        b: mx.array,
        A_log: mx.array,  # noqa: N803 - the library's name
        dt_bias: mx.array,
        state: mx.array | None = None,
        mask: mx.array | None = None,
        **kwargs: Any,
    ) -> Any:
        plain = kwargs.get("lower_bound") is None and not kwargs.get("allow_neg_eigval")
        if q.shape[1] < MIN_TOKENS or not plain:
            return original(q, k, v, a, b, A_log, dt_bias, state, mask, **kwargs)
        g = compute_g(A_log, a, dt_bias)
        if g.ndim != 3:  # a gate per key dimension: not chunked here
            return original(q, k, v, a, b, A_log, dt_bias, state, mask, **kwargs)
        if state is None:
            shape = (q.shape[0], v.shape[2], v.shape[3], q.shape[3])
            state = mx.zeros(shape, dtype=mx.float32)
        beta = mx.sigmoid(b)
        if mask is not None:  # padding (after a row's tokens) neither decays nor updates
            g, beta = mx.where(mask[..., None], g, 1.0), mx.where(mask[..., None], beta, 0.0)
        return chunked_gated_delta(q, k, v, g, beta, state)

    return update
