"""GGUF conversion itself: llama.cpp's q/k row permutation undone (also on quantized triplets),
Q4_1/Q8_0 kept quantized, logits as llama.cpp computes them, tokens as llama.cpp splits them,
and a conversion cached and reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxd.models import gguf

pytestmark = [pytest.mark.real]

TEXT = "Once upon a time, there was a small town in the Midwest"


def llama_cpp_permute(w: object, num_heads: int) -> object:
    # convert_hf_to_gguf.py LlamaModel.permute, on any array with reshape/swapaxes
    s = w.shape  # type: ignore[attr-defined]
    return w.reshape(num_heads, 2, s[0] // num_heads // 2, *s[1:]).swapaxes(1, 2).reshape(s)  # type: ignore[attr-defined]


def test_unpermute_inverts_llama_cpp_rows_of_quantized_triplets() -> None:
    import mlx.core as mx

    w = mx.random.normal((3 * 64, 128), key=mx.random.key(0))
    assert mx.array_equal(gguf._unpermute(llama_cpp_permute(w, 3), 3), w)
    q, scales, biases = mx.quantize(w, group_size=32, bits=4)
    back = [gguf._unpermute(llama_cpp_permute(a, 3), 3) for a in (q, scales, biases)]
    assert mx.array_equal(
        mx.dequantize(*back, group_size=32, bits=4),
        mx.dequantize(q, scales, biases, group_size=32, bits=4),
    )


@pytest.fixture(scope="module")
def quantized_dir(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf.ensure_converted(gguf_path, tmp_path_factory.mktemp("cache"), dequantize=False)


def test_q4_1_and_q8_0_tensors_stay_quantized(quantized_dir: Path) -> None:
    config = json.loads((quantized_dir / "config.json").read_text())
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["eos_token_id"] == [2]  # <|im_end|>


def test_quantized_and_float32_conversions_compute_the_same(
    quantized_dir: Path, converted_dir: Path
) -> None:
    import mlx.core as mx
    import mlx_lm

    ids = mx.array([[6403, 1980, 253, 655, 28]])  # "Once upon a time,"
    quantized, dequantized = (mlx_lm.load(str(d))[0](ids) for d in (quantized_dir, converted_dir))
    # The same weights; the quantized model computes with its float16 scales, hence the tolerance.
    assert mx.array_equal(quantized.argmax(-1), dequantized.argmax(-1))
    assert mx.abs(quantized - dequantized).max().item() < 0.25


def test_logits_match_llama_cpp_on_the_same_file(gguf_path: Path, converted_dir: Path) -> None:
    import mlx.core as mx
    import mlx_lm
    import numpy as np

    llama_cpp = pytest.importorskip("llama_cpp")
    model, tokenizer = mlx_lm.load(str(converted_dir))[:2]
    ids = tokenizer.encode(TEXT)
    ours = np.array(model(mx.array([ids]))[0])
    llama = llama_cpp.Llama(str(gguf_path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    llama.eval(ids)
    theirs = np.array(llama.scores[: len(ids)])
    # llama.cpp rounds activations to 8 bits in its Q4_1 dot products: close, not equal.
    assert min(np.corrcoef(a, b)[0, 1] for a, b in zip(ours, theirs, strict=True)) > 0.998
    assert np.mean(ours.argmax(-1) == theirs.argmax(-1)) >= 0.8


def test_tokenizer_matches_llama_cpp(gguf_path: Path, converted_dir: Path) -> None:
    from tokenizers import Tokenizer

    llama_cpp = pytest.importorskip("llama_cpp")
    ours = Tokenizer.from_file(str(converted_dir / "tokenizer.json"))
    vocab = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    for text in [
        TEXT,
        "Hello  world!\n\n  12345 abc",
        "it's 3.14 — naïve café 日本語",
        "<|im_start|>user\nhi<|im_end|>\n",
        "def f(x):\n    return x**2\n",
    ]:
        assert ours.encode(text).ids == vocab.tokenize(text.encode(), add_bos=False, special=True)


def test_a_cached_conversion_is_reused(gguf_path: Path, quantized_dir: Path) -> None:
    lines: list[str] = []
    written = (quantized_dir / "config.json").stat().st_mtime_ns
    again = gguf.ensure_converted(gguf_path, quantized_dir.parent, progress=lines.append)
    assert again == quantized_dir
    assert lines == []
    assert (quantized_dir / "config.json").stat().st_mtime_ns == written


def write_gguf(path: Path, kinds: list[str]) -> dict[str, object]:
    """A GGUF file with one 8x64 tensor per quant type; returns the dequantized values."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    writer = GGUFWriter(str(path), "llama")
    values = {}
    for i, kind in enumerate(kinds):
        x = np.random.default_rng(i).normal(size=(8, 64)).astype(np.float32)
        t = GGMLQuantizationType[kind]
        writer.add_tensor(f"t{i}.weight", quants.quantize(x, t), raw_dtype=t)
        values[f"t{i}"] = quants.dequantize(quants.quantize(x, t), t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def test_the_fallback_reader_writes_q4_0_and_q8_0_as_mlx_load_does(tmp_path: Path) -> None:
    import mlx.core as mx

    from mlxd.models import gguf_reader

    write_gguf(tmp_path / "a.gguf", ["Q4_0", "Q8_0", "Q4_1"])
    ours, _ = gguf_reader.read(tmp_path / "a.gguf")
    theirs = mx.load(str(tmp_path / "a.gguf"))
    assert ours.keys() == theirs.keys()
    assert all(mx.array_equal(ours[k], theirs[k]).item() for k in ours)


def test_types_mlx_cannot_load_are_dequantized(tmp_path: Path) -> None:
    import mlx.core as mx
    import numpy as np

    from mlxd.models import gguf_reader

    values = write_gguf(tmp_path / "b.gguf", ["Q5_0", "Q5_1"])
    with pytest.raises(RuntimeError):
        mx.load(str(tmp_path / "b.gguf"))
    ours, _ = gguf_reader.read(tmp_path / "b.gguf")
    for name, expected in values.items():
        assert ours[f"{name}.weight"].dtype == mx.float16
        assert np.allclose(np.array(ours[f"{name}.weight"]), expected, atol=1e-2)


def test_the_memory_budget_counts_the_converted_weights(
    gguf_path: Path, converted_dir: Path, mlxd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxd.config import ModelSpec, ServeConfig
    from mlxd.daemon.footprint import footprint

    monkeypatch.setenv("MLXD_HOME", str(mlxd_home))
    spec = ModelSpec(name="smollm2", path=str(gguf_path))
    weights = sum(f.stat().st_size for f in converted_dir.glob("*.safetensors"))
    assert footprint(spec, ServeConfig(models=(spec,))).weights_bytes == weights
