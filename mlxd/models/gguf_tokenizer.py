"""A Hugging Face tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) from GGUF metadata.

transformers can read a GGUF tokenizer only with torch installed, so we build the same files
with ``tokenizers`` (already a dependency) from the ``tokenizer.ggml.*`` keys. Byte-level BPE
(``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, ...) is supported; the pre-tokenizer
follows ``tokenizer.ggml.pre`` as llama.cpp's ``llama-vocab.cpp`` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mlxd.errors import ConfigError

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values that are added tokens
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
_LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
           r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")  # fmt: skip
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# tokenizer.ggml.pre -> the split regexes applied before byte-level BPE (llama-vocab.cpp)
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,),
    "gpt-2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
}


def write_tokenizer(metadata: dict[str, Any], out_dir: Path) -> list[int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for a GGUF file's tokenizer.

    Args:
        metadata: The GGUF key/value metadata, as ``mx.load(..., return_metadata=True)`` gives.
        out_dir: The model directory being built.

    Returns:
        The end-of-sequence token ids (EOS, and EOT when the file names one).
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"GGUF tokenizer {kind!r} is not supported (byte-level BPE only)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = _ints(metadata.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
    special = _special_tokens(metadata, tokens)
    tokenizer = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=[tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]],
            ignore_merges="llama" in str(metadata.get("tokenizer.ggml.pre")),
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(str(metadata.get("tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([t for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    tokenizer.add_tokens([t for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED])
    bos = special.get("bos_token")
    if _flag(metadata, "tokenizer.ggml.add_bos_token") and bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    config["add_bos_token"] = _flag(metadata, "tokenizer.ggml.add_bos_token")
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = str(metadata["tokenizer.chat_template"])
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return [i for i in (_id(metadata, "eos"), _id(metadata, "eot")) if i is not None]


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_SPLITS:
        raise ConfigError(f"GGUF pre-tokenizer {pre!r} is not supported; known: "
                          f"{', '.join(sorted(_PRE_SPLITS))}")  # fmt: skip
    splits: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_SPLITS[pre]
    ]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*splits, byte_level])


def _special_tokens(metadata: dict[str, Any], tokens: list[str]) -> dict[str, str]:
    names = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token", "padding": "pad_token"}
    return {
        key: tokens[i] for short, key in names.items() if (i := _id(metadata, short)) is not None
    }


def _id(metadata: dict[str, Any], short: str) -> int | None:
    value = _scalar(metadata.get(f"tokenizer.ggml.{short}_token_id"))
    return None if value is None else int(value)


def _flag(metadata: dict[str, Any], key: str) -> bool:
    return bool(_scalar(metadata.get(key)))


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value  # mx.array scalars


def _ints(value: Any) -> list[int]:
    values = value.tolist() if hasattr(value, "tolist") else value or []  # mx.array or list
    return [int(v) for v in values]
