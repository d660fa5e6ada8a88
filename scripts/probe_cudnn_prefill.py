"""Prefill forward time of a Qwen3-0.6B-shaped model (random, bf16) at several prompt lengths,
first call and repeated: run once with MLX_CUDA_USE_CUDNN_SDPA=1 and once with 0."""

import os
import time

import mlx.core as mx
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache

args = qwen3.ModelArgs(
    model_type="qwen3",
    hidden_size=1024,
    num_hidden_layers=28,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1e6,
    tie_word_embeddings=True,
)
model = qwen3.Model(args)
model.set_dtype(mx.bfloat16)
mx.eval(model.parameters())


def fwd(b, n):
    cache = make_prompt_cache(model)
    x = mx.random.randint(0, 1000, (b, n))
    t = time.perf_counter()
    mx.eval(model(x, cache=cache))
    return (time.perf_counter() - t) * 1e3


fwd(1, 64)
tag = os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "default")
for b, n in [(1, 512), (1, 2048), (1, 4096), (1, 8192), (8, 512), (4, 2048)]:
    first = fwd(b, n)
    again = sorted(fwd(b, n) for _ in range(3))[1]
    print(f"cudnn={tag} B={b} L={n}: first {first:.1f} ms, again {again:.1f} ms", flush=True)
