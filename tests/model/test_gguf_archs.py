"""Each GGUF architecture mlxd converts, round-tripped: a made mlx-lm model written as GGUF the
way llama.cpp's convert_hf_to_gguf.py writes it (llama's q/k rows permuted), converted back by
mlxd, computes the same logits and tokenizes the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlxd.models import gguf

pytestmark = pytest.mark.model

TEXTS = ["Hello  world!\n\n  12345 abc", "it's 3.14, naïve café", "<|im_start|>user\nhi<|im_end|>"]
_GGUF_NAMES = {hf: g for g, hf in (*gguf._LAYER_PARTS.items(), *gguf._TOP_PARTS.items())}


def gguf_name(hf: str) -> str:
    stem, suffix = hf.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, part = stem.split(".", 3)
        return f"blk.{layer}.{_GGUF_NAMES[part]}.{suffix}"
    return f"{_GGUF_NAMES[stem]}.{suffix}"


def permute(w: Any, num_heads: int) -> Any:  # convert_hf_to_gguf.py LlamaModel.permute
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(model_dir: Path, out: Path) -> None:
    import mlx.core as mx
    import numpy as np
    from gguf import GGUFWriter

    config = json.loads((model_dir / "config.json").read_text())
    arch = config["model_type"]
    writer = GGUFWriter(str(out), arch)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    for key, value in [
        ("block_count", config["num_hidden_layers"]),
        ("embedding_length", config["hidden_size"]),
        ("feed_forward_length", config["intermediate_size"]),
        ("attention.head_count", heads),
        ("attention.head_count_kv", config["num_key_value_heads"]),
        ("attention.key_length", head_dim),
        ("context_length", config["max_position_embeddings"]),
    ]:
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    writer.add_float32(f"{arch}.rope.freq_base", config.get("rope_theta", 10000.0))
    _add_tokenizer(writer, model_dir)
    if scaling := config.get("rope_scaling"):  # llama 3.1+: per-dim factors, as convert writes
        factors = gguf._llama3_factors(scaling, config["rope_theta"], head_dim)
        writer.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    kv_heads = {"q_proj": heads, "k_proj": config["num_key_value_heads"]}
    for f in sorted(model_dir.glob("*.safetensors")):
        for name, value in mx.load(str(f)).items():
            array = np.array(value.astype(mx.float32))
            part = name.split(".")[-2]
            if arch == "llama" and part in kv_heads:
                array = permute(array, kv_heads[part])
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tokenizer(writer: Any, model_dir: Path) -> None:
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    vocab.update({t["content"]: t["id"] for t in spec["added_tokens"]})
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # the made tokenizer splits as Qwen 2 does
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    )
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_chat_template(config["chat_template"])


@pytest.mark.parametrize("arch", gguf.ARCHS)
def test_a_gguf_written_like_llama_cpp_converts_back(arch: str, tmp_path: Path) -> None:
    import mlx.core as mx
    import mlx_lm

    from mlxd.models.maker import make_model

    made = make_model(tmp_path / arch, arch=arch, size="tiny", progress=lambda line: None)
    write_gguf(made, tmp_path / f"{arch}.gguf")
    converted = gguf.ensure_converted(tmp_path / f"{arch}.gguf", tmp_path / "cache")
    (model, tokenizer), (back, back_tokenizer) = (
        mlx_lm.load(str(d))[:2] for d in (made, converted)
    )
    ids = mx.array([[5, 17, 3, 250, 42, 7, 99, 1]])
    assert mx.allclose(model(ids), back(ids), atol=1e-4, rtol=1e-4)
    for text in TEXTS:
        assert back_tokenizer.encode(text) == tokenizer.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert back_tokenizer.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)


def test_llama3_rope_scaling_comes_back_from_rope_freqs(tmp_path: Path) -> None:
    import mlx.core as mx
    import mlx_lm

    from mlxd.models.maker import make_model

    made = make_model(tmp_path / "llama3", arch="llama", size="tiny", progress=lambda line: None)
    config = json.loads((made / "config.json").read_text())
    scaling = {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config.update(rope_scaling=scaling, max_position_embeddings=131072)
    (made / "config.json").write_text(json.dumps(config))
    write_gguf(made, tmp_path / "llama3.gguf")
    converted = gguf.ensure_converted(tmp_path / "llama3.gguf", tmp_path / "cache")
    assert json.loads((converted / "config.json").read_text())["rope_scaling"] == scaling
    ids = mx.array([list(range(3, 400))])
    model, back = (mlx_lm.load(str(d))[0] for d in (made, converted))
    assert mx.allclose(model(ids), back(ids), atol=1e-4, rtol=1e-4)
