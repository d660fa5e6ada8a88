"""A model's own layer caches, exactly as its ``make_cache()`` lays them out, batched by row.

Models whose layers are not one plain K/V cache each (sliding windows, recurrent state, hybrids,
shared-KV or cache-less layers, cache lists, MLA) get their caches from mlx-lm itself: the list
``make_cache()`` returns, in its length and kinds, never one per layer by assumption (Gemma 4's
shared-KV layers and Nemotron-H's MLP layers have none). A sequence prefills into its own list;
when its prompt is done each entry joins the decode batch through mlx-lm's ``merge`` (one
sequence -> ``BatchKVCache``, ``BatchRotatingKVCache``, ``ArraysCache`` rows, ``CacheList`` of
those) and ``extend``; rows leave through ``filter``. A cache kind with no ``merge`` cannot
batch: such a model decodes one sequence at a time (``is_batchable``).
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

# Kinds whose only state is K/V of every past token: the paged pool holds these.
_PLAIN = ("KVCache",)
# Kinds whose state is a fixed size, whatever the length: a hybrid's recurrent layers.
_RECURRENT = ("ArraysCache",)
# Kinds that keep the K/V of a sliding window: the pool holds these in slabs (window_slabs.py).
_WINDOW = ("RotatingKVCache",)


def model_caches(model: Any) -> list[Any]:
    """A fresh cache list for one sequence, as the model lays it out."""
    if hasattr(model, "make_cache"):
        return list(model.make_cache())
    from mlx_lm.models.cache import KVCache

    return [KVCache() for _ in model.layers]


def kinds(caches: list[Any]) -> list[str]:
    """The kind of each entry, a cache list as ``CacheList(A, B)``."""
    return [_kind(c) for c in caches]


def is_plain(model: Any) -> bool:
    """One plain K/V cache per layer: the paged pool and our own contiguous caches fit."""
    caches = model_caches(model)
    return len(caches) == len(model.layers) and all(k in _PLAIN for k in kinds(caches))


def is_hybrid(model: Any) -> bool:
    """Plain K/V caches and recurrent state (``ArraysCache``), nothing else, at least one of
    each: the pool holds the attention layers, each row's state rides beside it
    (``runners.hybrid``). Cache-less layers are fine: the model pairs caches with its layers."""
    names = kinds(model_caches(model))
    return (
        set(names) <= {*_PLAIN, *_RECURRENT}
        and any(n in _PLAIN for n in names)
        and any(n in _RECURRENT for n in names)
    )


def window_size(model: Any) -> int:
    """The window of a model whose caches are plain K/V and sliding-window ones of one size
    (at least one of each; no kept sink tokens), whose window layers' masks ask for it (the
    pool masks keys outside it, where mlx-lm's rotating cache drops them; a model relying on
    the rotation alone would see its whole context): 0 for any other."""
    caches = model_caches(model)
    names = kinds(caches)
    if set(names) != {*_PLAIN, *_WINDOW}:
        return 0
    rotating = [c for c, n in zip(caches, names, strict=True) if n in _WINDOW]
    sizes = {c.max_size for c in rotating}
    if len(sizes) != 1 or any(getattr(c, "keep", 0) for c in rotating):
        return 0
    window = sizes.pop()
    asked = _asked_windows(model, len(caches))
    if window not in asked or 0 in asked:  # 0: a layer reads another's K/V from its cache
        return 0
    model(mx.array([[0]]), cache=caches)  # each pool's layers must share one K/V shape
    shapes = [
        {
            (c.state[0].shape[1:], c.state[1].shape[1:], c.state[0].dtype)
            for c, n in zip(caches, names, strict=True)
            if n in kind
        }
        for kind in (_PLAIN, _WINDOW)
    ]
    return window if all(len(s) == 1 for s in shapes) else 0


def _asked_windows(model: Any, entries: int) -> set[int]:
    """The windows ``model``'s forward asks its caches' masks for (one token, plain caches),
    with 0 when a layer reads a cache's K/V outside ``update_and_fetch`` (Gemma 3n's layers
    that share another's: the pool's caches hand K/V out only as a step writes them)."""
    from mlx_lm.models.cache import KVCache

    asked: set[int] = set()

    class Probe(KVCache):  # type: ignore[misc]
        def make_mask(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("window_size"):
                asked.add(kwargs["window_size"])
            return super().make_mask(*args, **kwargs)

        def update_and_fetch(self, keys: Any, values: Any) -> Any:
            self.writing = True
            try:
                return super().update_and_fetch(keys, values)
            finally:
                self.writing = False

        def keys_and_values(self) -> Any:
            if not getattr(self, "writing", False):
                asked.add(0)
            return super().keys_and_values()

    model(mx.array([[0]]), cache=[Probe() for _ in range(entries)])
    return asked


def window_entries(caches: list[Any]) -> list[bool]:
    """Which entries of a cache list keep a sliding window (the window pool's layers)."""
    return [k in _WINDOW for k in kinds(caches)]


def state_bytes(model: Any) -> int:
    """Bytes of one sequence's recurrent state (its non-K/V entries after one token: their size
    does not grow with the sequence)."""
    caches = model_caches(model)
    model(mx.array([[0]]), cache=caches)
    return nbytes([c for c, a in zip(caches, attention_entries(caches), strict=True) if not a])


def attention_entries(caches: list[Any]) -> list[bool]:
    """Which entries of a cache list are plain K/V caches (the pool's layers, in order)."""
    return [k in _PLAIN for k in kinds(caches)]


def is_batchable(model: Any) -> bool:
    """Whether every entry can join a batch (mlx-lm's ``merge``)."""
    return all(_batchable(c) for c in model_caches(model))


def batches_rows(model: Any, compare: bool = True) -> bool:
    """Whether ``model`` decodes a batch of rows of different lengths as it decodes each alone:
    three sequences prefilled alone, merged, one decode step, each row's logits against its
    own (a probe at load). Some models fail outright (GPT-BigCode's numpy positions, Gemma 2's
    mask rank for grouped scores), others differ (AFM7's layers that reuse another's K/V);
    they decode one sequence at a time. ``compare=False`` checks only that the batch runs."""
    if not is_batchable(model):
        return False
    rows = []
    for n in (3, 5, 2):
        caches = model_caches(model)
        model(mx.arange(1, n + 1)[None], cache=caches)
        rows.append(caches)
    alone = (
        [model(mx.array([[i + 1]]), cache=copy.deepcopy(r))[0, -1] for i, r in enumerate(rows)]
        if compare
        else []
    )
    try:
        batch = [type(c).merge([r[i] for r in rows]) for i, c in enumerate(rows[0])]
        logits = model(mx.array([[1], [2], [3]]), cache=batch)[:, -1]
        mx.eval(logits)
    except Exception:  # noqa: BLE001 - any failure means: not as a batch
        return False
    return all(_close(logits[i], a) for i, a in enumerate(alone))


def prefills_rows(model: Any) -> bool:
    """Whether ``model`` prefills prompts of different lengths together (``prefill``) as it
    prefills each alone: two decode steps after, against each prompt's own (a probe at load,
    as ``batches_rows``; not the prefill's logits: the worker's head computes only the last
    position's, a padding one for the shorter prompt). Prompts run past a sliding window (up
    to 256 tokens), where plamo3's window mask tells padded rows from their own."""
    past = min(_window(model_caches(model)), 256)
    prompts = [[i % 50 + 1 for i in range(past + n)] for n in (3, 5)]
    alone = []
    for p in prompts:
        caches = model_caches(model)
        model(mx.array([p]), cache=caches)
        alone.append([model(mx.array([[t]]), cache=caches)[0, -1] for t in (9, 10)])
    try:
        batch, _ = prefill(model, [model_caches(model) for _ in prompts], prompts)
        steps = [model(mx.array([[t], [t]]), cache=batch)[:, -1] for t in (9, 10)]
        mx.eval(steps)
    except Exception:  # noqa: BLE001 - any failure means: one prompt at a time
        return False
    return all(
        _close(step[i], own[k]) for k, step in enumerate(steps) for i, own in enumerate(alone)
    )


def prefill(
    model: Any, rows: list[list[Any]], prompts: list[list[int]]
) -> tuple[list[Any], mx.array]:
    """Prompts of different lengths in one forward, right-padded, on their merged caches
    (mlx-lm's batch generator does the same: the caches mask each row's padding, ``prepare``,
    and move it to the left after, ``finalize``). Returns the batch's caches and the logits."""
    batch = merge(rows)
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    pads = [width - n for n in lengths]
    if any(pads):
        for cache in batch:
            cache.prepare(lengths=lengths, right_padding=pads)
    logits = model(mx.array([p + [0] * (width - len(p)) for p in prompts]), cache=batch)
    if any(pads):
        for cache in batch:
            cache.finalize()
    return batch, logits


def _window(caches: list[Any]) -> int:
    """The largest sliding window among ``caches`` (0: none)."""
    sizes = [
        _window(c.caches) if hasattr(c, "caches") else getattr(c, "max_size", 0) or 0
        for c in caches
    ]
    return max(sizes, default=0)


def _close(batched: mx.array, alone: mx.array) -> bool:
    """Equal up to rounding: a batch changes kernel shapes, so half precision may differ."""
    tol = 1e-3 if alone.dtype == mx.float32 else 3e-2
    scale = mx.abs(alone).max().item()
    return bool(mx.abs(batched.astype(mx.float32) - alone).max().item() <= tol * max(scale, 1.0))


def extract(batch: list[Any], row: int, model: Any) -> list[Any]:
    """Row ``row`` of the decode batch as one sequence's caches (a layer whose cache holds
    nothing yet, such as a linear-attention layer's unused K/V, gets a fresh one)."""
    fresh = model_caches(model)
    return [fresh[i] if _is_empty(c) else c.extract(row) for i, c in enumerate(batch)]


def merge(rows: list[list[Any]]) -> list[Any]:
    """Several sequences' caches as one batch, layer by layer (mlx-lm's ``merge``)."""
    return [type(c).merge([r[i] for r in rows]) for i, c in enumerate(rows[0])]


def to_batch(caches: list[Any]) -> list[Any]:
    """One prefilled sequence's caches as a batch of one row (itself if it cannot batch)."""
    return [type(c).merge([c]) if _batchable(c) else c for c in caches]


def extend(batch: list[Any], part: list[Any]) -> list[Any]:
    """``batch`` with ``part``'s rows appended (``part`` itself when ``batch`` has none)."""
    if not batch:
        return part
    for mine, theirs in zip(batch, part, strict=True):
        mine.extend(theirs)
    return batch


def keep_rows(batch: list[Any], keep: list[int]) -> list[Any]:
    """``batch`` with only the rows ``keep``, in that order (empty when none)."""
    if not keep:
        return []
    idx = mx.array(keep)
    for cache in batch:
        cache.filter(idx)
    return batch


def nbytes(caches: list[Any]) -> int:
    return sum(a.nbytes for a in arrays(caches))


def arrays(caches: list[Any]) -> list[mx.array]:
    """Every array the caches hold (to evaluate them)."""
    return [a for c in caches for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]


def _kind(cache: Any) -> str:
    if hasattr(cache, "caches"):
        return f"{type(cache).__name__}({', '.join(_kind(c) for c in cache.caches)})"
    return type(cache).__name__


def _is_empty(cache: Any) -> bool:
    empty = getattr(cache, "empty", None)
    try:
        return bool(empty()) if empty is not None else False
    except NotImplementedError:
        return False


def _batchable(cache: Any) -> bool:
    children = getattr(cache, "caches", ())
    return hasattr(type(cache), "merge") and all(_batchable(c) for c in children)
