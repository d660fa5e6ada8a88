"""A Hugging Face tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) from GGUF metadata.

transformers can read a GGUF tokenizer only with torch installed, so we build the same files
with ``tokenizers`` (already a dependency) from the ``tokenizer.ggml.*`` keys: byte-level BPE
(``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, SmolLM, ...), split before BPE as
``tokenizer.ggml.pre`` says (the regexes of llama.cpp's ``llama-vocab.cpp``), and SentencePiece
BPE (``"llama"``: Llama 2, Mistral, ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from mlxd.errors import ConfigError

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # tokenizer.ggml.token_type values
SPACE = "\u2581"  # SentencePiece's visible space
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
_LLAMA3 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
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
    if kind not in _BUILDERS:
        raise ConfigError(f"GGUF tokenizer {kind!r} is not supported (gpt2 and llama only)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = _ints(metadata.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
    special = _special_tokens(metadata, tokens)
    tokenizer = _BUILDERS[kind](metadata, tokens, types)
    tokenizer.add_special_tokens([t for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    tokenizer.add_tokens([t for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED])
    bos = special.get("bos_token")
    add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token", default=kind == "llama")
    if add_bos and bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    config["add_bos_token"] = add_bos
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = str(metadata["tokenizer.chat_template"])
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return [i for i in (_id(metadata, "eos"), _id(metadata, "eot")) if i is not None]


def _byte_level_bpe(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    """``gpt2``: byte-level BPE with the file's merges, split as ``tokenizer.ggml.pre`` says."""
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    tokenizer = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=[tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]],
            ignore_merges="llama" in pre,
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    """``llama`` (Llama 2, Mistral, ...): SentencePiece BPE, which merges the pair whose result
    scores highest; as merges ranked by that score (transformers' GGUF converter does the same),
    with byte fallback to the ``<0xNN>`` tokens."""
    scores = [float(x) for x in _floats(metadata.get("tokenizer.ggml.scores"))]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str, float]] = []
    for piece, i in vocab.items():
        if types[i] != NORMAL or len(piece) < 2:
            continue
        pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        pairs = sorted(
            (p for p in pairs if p[0] in vocab and p[1] in vocab),
            key=lambda p: (vocab[p[0]], vocab[p[1]]),
        )
        merges.extend((left, right, scores[i]) for left, right in pairs)
    merges.sort(key=lambda m: -m[2])
    unk = _id(metadata, "unknown")
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(left, right) for left, right, _ in merges],
            unk_token=None if unk is None else tokens[unk],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # llama.cpp prefixes a space to every piece of text between special tokens, as this does.
    prefix = _flag(metadata, "tokenizer.ggml.add_space_prefix", default=True)
    replace = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if prefix else replace
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tokenizer


_BUILDERS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_SPLITS:
        raise ConfigError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(_PRE_SPLITS))}"
        )
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


def _flag(metadata: dict[str, Any], key: str, default: bool = False) -> bool:
    value = _scalar(metadata.get(key))
    return default if value is None else bool(value)


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value  # mx.array scalars


def _floats(value: Any) -> list[float]:
    values = value.tolist() if hasattr(value, "tolist") else value or []  # mx.array or list
    return [float(v) for v in values]


def _ints(value: Any) -> list[int]:
    values = value.tolist() if hasattr(value, "tolist") else value or []  # mx.array or list
    return [int(v) for v in values]
