"""The KV sizing rule read from ``config.json`` (the daemon's footprint) against the K/V the
worker's pool holds for the same model, as its caches shape it (``paged_cache.kv_shape``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

# plain, hybrid (conv, gated-delta, Mamba, KDA), MLA, sliding-window and looped layouts
ARCHS = ["qwen3", "lfm2", "qwen3_next", "nemotron_h", "jamba", "kimi_linear", "plamo2"]
ARCHS += ["bailing_moe_linear", "deepseek_v3", "deepseek_v2", "gemma3_text", "gpt_oss"]
ARCHS += ["gemma4_text", "iquestloopcoder"]
# The zoo's shared base carries MLA's fields for every arch (each ModelArgs keeps its own); a
# real config.json has them only where the model is MLA.
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_MLA_ARCHS = ("deepseek_v3", "deepseek_v2", "kimi_linear")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_config_rule_counts_what_the_pool_holds(arch: str) -> None:
    from mlxd.models.kv_layout import config_token_bytes
    from mlxd.models.maker import _build_model
    from mlxd.models.zoo import zoo_config
    from mlxd.worker.kv.layer_caches import model_caches, window_entries
    from mlxd.worker.kv.paged_cache import KVPool

    config = zoo_config(arch)
    if arch not in _MLA_ARCHS:
        for name in _MLA_FIELDS:
            config.pop(name, None)
    model = _build_model(config)
    held = KVPool.bytes_per_token(model)
    if any(window_entries(model_caches(model))):  # the window layers' slabs (window_runner)
        held += KVPool.bytes_per_token(model, windows=True)
    assert config_token_bytes(config, dtype_bytes=4) == held
