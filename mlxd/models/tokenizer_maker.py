"""Offline tokenizer maker: a byte-level BPE trained on Python stdlib source.

The corpus is the source text of a fixed list of stdlib modules, so training needs no network and
gives the same tokenizer on every run of one Python version. Special tokens take the first ids,
then the trained merges; a vocabulary larger than the trained one is padded with reserved tokens,
so every id a random model can sample decodes to text.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# Order fixes the ids: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2, <tool_call>=3, ...
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
CONTROL_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
PAD_TOKEN_ID = 0
EOS_TOKEN_ID = 2
TRAINED_VOCAB_SIZE = 8192
RESERVED_TOKEN = "<|reserved_{}|>"
# Qwen2's split: transformers rebuilds this pipeline for model_type qwen2, so every arch uses it.
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Present under the same import name in every Python >= 3.11.
_CORPUS_MODULES = (
    "argparse",
    "asyncio.tasks",
    "calendar",
    "collections",
    "contextlib",
    "dataclasses",
    "datetime",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "http.client",
    "inspect",
    "json.decoder",
    "json.encoder",
    "logging",
    "pathlib",
    "random",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "urllib.parse",
    "zipfile",
)

# ChatML, Qwen style. "tool_call.name" appears verbatim so mlx-lm picks its json_tools parser.
CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable -%}
    {%- for part in content -%}
      {%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' -%}
    {{- text(messages[0].content) + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
  {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'system' and loop.first -%}
  {%- elif message.role in ['user', 'system']
        or (message.role == 'assistant' and not message.tool_calls) -%}
    {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.content -%}{{- '\n' + text(message.content) -}}{%- endif -%}
    {%- for tool_call in message.tool_calls -%}
      {%- if tool_call.function is defined -%}
        {%- set tool_call = tool_call.function -%}
      {%- endif -%}
      {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
      {%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}
      {%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


# Public API


def make_tokenizer(out_dir: Path, *, vocab_size: int, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``out_dir``.

    Args:
        out_dir: An existing directory.
        vocab_size: Exact number of ids; ids past the trained vocabulary become reserved tokens.
        model_max_length: The context length recorded for transformers.
    """
    spec = json.loads(_trained_tokenizer(min(vocab_size, TRAINED_VOCAB_SIZE)))
    _pad_vocab(spec["model"]["vocab"], vocab_size)
    _write_json(out_dir / "tokenizer.json", spec, indent=None)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(model_max_length))
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map())


# Internal helpers


@functools.lru_cache(maxsize=4)
def _trained_tokenizer(vocab_size: int) -> str:
    """Train once per process and size; returns the tokenizer.json text."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *CONTROL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    spec = json.loads(tokenizer.to_str())
    # Qwen keeps tool/think markers non-special so skip_special_tokens leaves them in the text.
    for token in spec["added_tokens"]:
        token["special"] = token["content"] in SPECIAL_TOKENS
    return json.dumps(spec, ensure_ascii=False)


def _corpus() -> list[str]:
    texts = []
    for name in _CORPUS_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"stdlib module {name} has no source file")
        texts.append(Path(spec.origin).read_text(encoding="utf-8"))
    return texts


def _pad_vocab(vocab: dict[str, int], vocab_size: int) -> None:
    # Plain BPE entries without merges: encoding never yields them, decoding prints their name.
    # Loading 150k of them this way takes well under a second; as added tokens it would not.
    next_id, index = len(vocab), 0
    while next_id < vocab_size:
        name = RESERVED_TOKEN.format(index)
        index += 1
        if name not in vocab:
            vocab[name] = next_id
            next_id += 1


def _tokenizer_config(model_max_length: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _special_tokens_map() -> dict[str, Any]:
    return {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}


def _write_json(path: Path, data: dict[str, Any], indent: int | None = 2) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")
