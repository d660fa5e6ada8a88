"""The paged KV cache gives the same logits as mlx-lm's KVCache, for several architectures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model

PROMPTS = [[5, 17, 300, 41, 7, 99, 12], [8, 8, 2000, 3], [1000 + i for i in range(40)]]


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def arch_model(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import mlx_lm

    from mlxd.models.maker import make_model

    out = tmp_path_factory.mktemp("paged") / request.param
    path: Path = make_model(out, arch=request.param, size="tiny", progress=lambda _: None)
    return mlx_lm.load(str(path))[0]


def reference_logits(model: Any, prompt: list[int], steps: list[int]) -> list[Any]:
    """Logits of the last prompt token, then of each forced decode token, via KVCache."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    out = [model(mx.array([prompt]), cache=cache)[0, -1]]
    for tok in steps:
        out.append(model(mx.array([[tok]]), cache=cache)[0, -1])
    return out


def test_paged_prefill_and_decode_match_kv_cache(arch_model: Any) -> None:
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    pool = KVPool.for_model(arch_model, num_blocks=32, block_size=4)
    # deliberately scattered, non-contiguous blocks
    tables = [[9, 2, 30, 14], [1, 27], [3, 5, 7, 11, 13, 15, 17, 19, 21, 23, 25, 29]]
    forced = [11, 12, 13]
    lens = [len(p) for p in PROMPTS]
    step = PagedStep.build(tables, [0, 0, 0], lens, pool)
    width = max(lens)
    tokens = mx.array([[0] * (width - n) + p for p, n in zip(PROMPTS, lens, strict=True)])
    got = [arch_model(tokens, cache=PagedKVCache.for_step(pool, step))[:, -1]]
    ctx = lens
    for tok in forced:
        step = PagedStep.build(tables, ctx, [1, 1, 1], pool)
        got.append(
            arch_model(mx.array([[tok]] * 3), cache=PagedKVCache.for_step(pool, step))[:, -1]
        )
        ctx = [c + 1 for c in ctx]
    for row, prompt in enumerate(PROMPTS):
        ref = reference_logits(arch_model, prompt, forced)
        for i, r in enumerate(ref):
            assert mx.allclose(got[i][row], r, atol=1e-4, rtol=1e-4), (row, i)
            assert int(mx.argmax(got[i][row])) == int(mx.argmax(r))


def test_copy_block_duplicates_every_layer(arch_model: Any) -> None:
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    pool = KVPool.for_model(arch_model, num_blocks=8, block_size=4)
    step = PagedStep.build([[3, 4]], [0], [6], pool)
    arch_model(mx.array([[1, 2, 3, 4, 5, 6]]), cache=PagedKVCache.for_step(pool, step))
    pool.copy_block(4, 6)
    for keys in pool.keys:
        assert mx.array_equal(keys[16:20], keys[24:28])


def test_copy_block_updates_the_pool_in_place() -> None:
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool

    pool = KVPool(4, 512, 32, 4, 64, 64, mx.float16)  # 64 MiB
    mx.eval(pool.keys, pool.values)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    pool.copy_block(3, 7)
    mx.eval(pool.keys, pool.values)
    assert mx.get_peak_memory() - before < pool.nbytes // 16  # a block per layer, not the pool


SHAPES = [("bfloat16", 8, 128, 32), ("float32", 2, 5, 3), ("float16", 1, 3, 1)]


@pytest.mark.parametrize(("dtype", "heads", "dim", "block"), SHAPES)
def test_gather_blocks_equals_indexing_element_wise(
    dtype: str, heads: int, dim: int, block: int
) -> None:
    """Blocks moved as wide words (8, 4, 2 or 1 bytes, whatever divides a block) are the same
    values as indexing the (blocks, block, heads, dim) view."""
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import gather_blocks

    num_blocks = 7
    buf = mx.random.normal((num_blocks * block, heads, dim)).astype(getattr(mx, dtype))
    table = mx.array([[3, 0, 6], [1, 1, 5]])
    expected = buf.reshape(num_blocks, block, heads, dim)[table].reshape(2, -1, heads, dim)
    assert mx.array_equal(gather_blocks(buf, block, table), expected).item()


def test_new_prompts_attend_to_their_own_keys_and_a_hit_reads_the_pool(
    arch_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill with nothing cached writes the pool but does not read it back (uniform rows or
    not); one that continues cached tokens gathers them."""
    import mlx.core as mx

    from mlxd.worker.kv import paged_cache
    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    reads: list[int] = []
    gather = paged_cache.gather_blocks
    monkeypatch.setattr(paged_cache, "gather_blocks", lambda *a: reads.append(1) or gather(*a))
    pool = KVPool.for_model(arch_model, num_blocks=32, block_size=4)

    def forward(tables: list[list[int]], ctx: list[int], prompts: list[list[int]]) -> mx.array:
        width = max(len(p) for p in prompts)
        rows = [[0] * (width - len(p)) + p for p in prompts]
        step = PagedStep.build(tables, ctx, [len(p) for p in prompts], pool)
        return arch_model(mx.array(rows), cache=PagedKVCache.for_step(pool, step))[:, -1]

    mx.eval(forward([[1, 2]], [0], [PROMPTS[0]]))
    mx.eval(forward([[3, 4], [5]], [0, 0], PROMPTS[:2]))
    assert reads == []
    got = forward([[1, 2, 6]], [7], [[11, 12]])  # continues PROMPTS[0], cached in blocks 1, 2
    assert len(reads) == 2 * len(pool.keys)  # K and V of every layer
    ref = reference_logits(arch_model, PROMPTS[0] + [11], [12])[-1]
    assert mx.allclose(got[0], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("context", [0, 16], ids=["fresh", "cached"])
def test_padding_keys_are_zeroed_so_no_real_row_reads_a_non_finite_one(context: int) -> None:
    """A left-padded row's padding queries sit at negative positions, where some models compute
    non-finite K/V (Mistral 3's attention scale is log(1 + floor(pos / n)): -inf). A masked key
    still multiplies its zero weight into the output, so such a key would turn every row that
    reads it, and the scratch block padding writes to, into NaN."""
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    pool = KVPool(
        1, num_blocks=8, block_size=16, n_kv_heads=1, k_head_dim=4, v_head_dim=4, dtype=mx.float32
    )
    step = PagedStep.build([[0, 1], [2, 3]], [context, context], [3, 1], pool)
    keys = mx.ones((2, 1, 3, 4))
    keys[1, :, :2] = mx.nan  # row 1 is one real token after two of padding
    cache = PagedKVCache.for_step(pool, step)[0]
    k, v = cache.update_and_fetch(keys, keys)
    assert mx.isfinite(k).all().item() and mx.isfinite(v).all().item()
    assert mx.isfinite(pool.keys[0]).all().item() and mx.isfinite(pool.values[0]).all().item()


@pytest.mark.parametrize("context", [0, 16], ids=["fresh", "cached"])
def test_image_spans_keep_one_mask_per_row_for_every_head(context: int) -> None:
    """Two rows of one length, each with an image whose tokens attend both ways: the overlaid
    mask is (rows, 1, queries, keys), one per row broadcast over heads (two rows with no mask
    of their own made it (2, 2, ...): a forward of two image prompts together failed)."""
    import mlx.core as mx

    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    pool = KVPool(
        1, num_blocks=8, block_size=16, n_kv_heads=1, k_head_dim=4, v_head_dim=4, dtype=mx.float32
    )
    step = PagedStep.build([[0, 1, 4], [2, 3, 5]], [context, context], [6, 6], pool)
    step = step.with_spans([[(context + 1, context + 4)], [(context + 2, context + 5)]])
    mask = PagedKVCache.for_step(pool, step)[0].make_mask(6, return_array=True)
    assert isinstance(mask, mx.array) and mask.shape == (2, 1, 6, context + 6)
    first = mask[0, 0, 1:4, context + 1 : context + 4]  # row 0's image: both ways
    assert first.all().item() and not mask[1, 0, 1, context + 3].item()  # row 1's is elsewhere
    assert mask[1, 0, 2, context + 4].item()  # row 1's image: a query sees a later image key


@pytest.mark.parametrize("bucketed", [False, True])
def test_a_chunk_reads_no_key_past_its_own_end(
    bucketed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt holds blocks for its whole length from its first chunk on; its second
    chunk reads two chunks of keys, not all of them, so it runs on the attention shape
    (plan, on CUDA) any prompt's second chunk does, and attends over no keys it cannot see."""
    import mlx.core as mx

    from mlxd.worker.kv import attention_shapes
    from mlxd.worker.kv.paged_cache import KVPool, PagedStep

    monkeypatch.setattr(attention_shapes, "BUCKETED", bucketed)
    pool = KVPool(
        1, num_blocks=10, block_size=16, n_kv_heads=1, k_head_dim=4, v_head_dim=4, dtype=mx.float32
    )
    step = PagedStep.build([list(range(9))], [32], [32], pool)  # 9 blocks: a 140-token prompt
    assert step.read_blocks.shape == (1, 4)
    assert step.mask is None or step.mask.shape[-1] == 64  # no mask: uniform rows, exact
