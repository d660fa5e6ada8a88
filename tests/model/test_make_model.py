"""The model maker: presets, tokenizer, weights, quantization, the CLI and the default model."""

from __future__ import annotations

import importlib
import json
import random
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from mlxd.cli.main import main
from mlxd.errors import ConfigError
from mlxd.models.maker import ensure_default_model, make_model
from mlxd.models.presets import ARCHS, model_config
from mlxd.models.tokenizer_maker import EOS_TOKEN_ID, PAD_TOKEN_ID, make_tokenizer

pytestmark = pytest.mark.model

MULTI_BYTE = "héllo 世界 🎉 naïve 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 22C"},
]


def _quiet(line: str) -> None:
    pass


def _make(tmp_path: Path, name: str = "m", **kwargs: Any) -> Path:
    return make_model(tmp_path / name, progress=_quiet, **kwargs)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return mlx_lm.load(str(tiny_model))[1]


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_and_generates(tmp_path: Path, arch: str) -> None:
    model, tokenizer = mlx_lm.load(str(_make(tmp_path, arch=arch)))
    text = mlx_lm.generate(model, tokenizer, "Hello there", max_tokens=8)
    assert isinstance(text, str)
    assert tokenizer.eos_token_ids == {EOS_TOKEN_ID}


def test_tokenizer_decodes_every_id(tokenizer: Any) -> None:
    vocab_size = model_config("qwen3", "tiny")["vocab_size"]
    assert len(tokenizer) == vocab_size
    ids = random.Random(0).sample(range(vocab_size), 200) + [vocab_size - 1]
    assert all(tokenizer.decode([i]) for i in ids)


def test_tokenizer_round_trips_multi_byte_text(tokenizer: Any) -> None:
    ids = tokenizer.encode(MULTI_BYTE)
    assert tokenizer.decode(ids) == MULTI_BYTE


def test_tokenizer_special_tokens(tokenizer: Any) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id == PAD_TOKEN_ID
    assert tokenizer.bos_token is None
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<tool_call>")
    assert ids[-1] == EOS_TOKEN_ID
    # Tool and think markers survive skip_special_tokens, as in Qwen.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_real_vocab_is_padded_with_reserved_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    make_tokenizer(tmp_path, vocab_size=151936, model_max_length=40960)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 151936
    assert tokenizer.decode([151935]).startswith("<|reserved_")
    assert tokenizer.decode(tokenizer.encode(MULTI_BYTE)) == MULTI_BYTE


def test_chat_template_renders_tools(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\nsunny, 22C\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_plain_conversation(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(
    ("arch", "size", "dims", "num_params"),
    [
        ("qwen3", "qwen3-0.6b", (1024, 28, 16, 8, 128, 3072, 151936), 596_049_920),
        ("qwen3", "qwen3-1.7b", (2048, 28, 16, 8, 128, 6144, 151936), 1_720_574_976),
        ("llama", "llama-3.2-1b", (2048, 16, 32, 8, 64, 8192, 128256), 1_235_814_400),
        ("llama", "llama-3.2-3b", (3072, 28, 24, 8, 128, 8192, 128256), 3_212_749_824),
    ],
)
def test_real_shape_presets_have_true_dims(
    arch: str, size: str, dims: tuple[int, ...], num_params: int
) -> None:
    config = model_config(arch, size)
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
    )
    assert tuple(config[k] for k in keys) == dims
    assert config["tie_word_embeddings"] is True
    # MLX builds parameters lazily, so counting them allocates nothing.
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    model = module.Model(module.ModelArgs.from_dict(config))
    assert sum(p.size for _, p in tree_flatten(model.parameters())) == num_params


def test_llama_real_shape_uses_llama3_rope() -> None:
    config = model_config("llama", "llama-3.2-1b")
    assert config["rope_theta"] == 500_000.0
    assert config["rope_scaling"]["rope_type"] == "llama3"
    assert config["rope_scaling"]["factor"] == 32.0


def test_unknown_preset_lists_valid_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"valid: .*--arch qwen3 --size tiny\|small\|deep\|qwen3-0.6b"
    ):
        model_config("qwen2", "qwen3-0.6b")


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_tiny_model_loads(tmp_path: Path, bits: int) -> None:
    model_dir = _make(tmp_path, quantize_bits=bits)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": bits, "mode": "affine"}
    model, tokenizer = mlx_lm.load(str(model_dir))
    assert isinstance(mlx_lm.generate(model, tokenizer, "Hello", max_tokens=4), str)


def test_same_seed_same_weights(tmp_path: Path) -> None:
    first, second, other = (
        _make(tmp_path, name, seed=s) for name, s in [("a", 1), ("b", 1), ("c", 2)]
    )
    a, b, c = (mx.load(str(d / "model.safetensors")) for d in (first, second, other))
    assert a.keys() == b.keys()
    assert all(mx.array_equal(a[k], b[k]) for k in a)
    assert not mx.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_dtype_is_applied(tmp_path: Path) -> None:
    weights = mx.load(str(_make(tmp_path, dtype="bfloat16") / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {mx.bfloat16}


def test_make_model_refuses_existing_dir(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        _make(tmp_path)


def test_make_model_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        _make(tmp_path, dtype="int8")
    with pytest.raises(ConfigError, match="4 or 8"):
        _make(tmp_path, quantize_bits=3)
    assert list(tmp_path.iterdir()) == []


def test_cli_makes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "cli-model"
    result = CliRunner().invoke(main, ["make-model", "--arch", "llama", "--out", str(out)])
    assert result.exit_code == 0, result.output
    model, tokenizer = mlx_lm.load(str(out))
    assert isinstance(mlx_lm.generate(model, tokenizer, "Hi", max_tokens=4), str)
    assert [p.name for p in tmp_path.iterdir()] == ["cli-model"]  # no temp dir left behind


def test_cli_refuses_existing_dir_without_force(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    result = CliRunner().invoke(main, ["make-model", "--out", str(out)])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f"Error: {out} already exists (use --force to overwrite)"
    ]
    result = CliRunner().invoke(main, ["make-model", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file()


def test_cli_unknown_arch_is_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["make-model", "--arch", "gpt5", "--out", str(tmp_path / "m")]
    )
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "unknown model preset gpt5/tiny" in result.output


def test_default_model_is_made_once(tmp_path: Path) -> None:
    paths: list[Path] = []
    threads = [
        threading.Thread(target=lambda: paths.append(ensure_default_model(tmp_path, _quiet)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    model_dir = tmp_path / "models" / "mlxd-default"
    assert paths == [model_dir, model_dir]
    made_at = (model_dir / "config.json").stat().st_mtime_ns
    assert ensure_default_model(tmp_path, _quiet) == model_dir
    assert (model_dir / "config.json").stat().st_mtime_ns == made_at
    assert json.loads((model_dir / "config.json").read_text())["hidden_size"] == 256
