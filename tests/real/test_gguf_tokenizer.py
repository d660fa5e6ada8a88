"""A SentencePiece (``tokenizer.ggml.model == "llama"``) GGUF vocabulary, as Llama 2 and Mistral
files carry, tokenized by mlxd's converted tokenizer exactly as llama.cpp tokenizes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.models.gguf_tokenizer import write_tokenizer

pytestmark = [pytest.mark.real]

TEXTS = [
    "Hello world, the worker loads the model.",
    "  two  spaces",
    "naïve 日本 café\n\nnew",
    "x</s>y z",
    " leading",
    "trailing ",
    "KV cache: --max-num-seqs 64!",
    "</s>",
    "",
]


def write_spm_vocab(out: Path, corpus: list[str]) -> None:
    """A vocab-only llama GGUF: <unk> <s> </s>, 256 byte tokens, then BPE pieces scored by rank."""
    from gguf import GGUFWriter
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False))
    pieces = sorted(bpe.get_vocab(), key=bpe.get_vocab().__getitem__)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    writer = GGUFWriter(str(out), "llama")
    for key, value in [
        ("block_count", 1),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 2),
        ("context_length", 128),
    ]:
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_sentencepiece_vocab_tokenizes_as_llama_cpp_does(tmp_path: Path) -> None:
    import mlx.core as mx
    from tokenizers import Tokenizer

    llama_cpp = pytest.importorskip("llama_cpp")
    root = Path(__file__).parents[2]
    write_spm_vocab(tmp_path / "spm.gguf", [p.read_text() for p in root.glob("docs/*.md")])
    _, metadata = mx.load(str(tmp_path / "spm.gguf"), return_metadata=True)
    assert write_tokenizer(metadata, tmp_path) == [2]
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    theirs = llama_cpp.Llama(str(tmp_path / "spm.gguf"), vocab_only=True, verbose=False)
    for text in TEXTS:
        ids = theirs.tokenize(text.encode(), add_bos=True, special=True)
        assert ours.encode(text).ids == ids
        assert ours.decode(ids, skip_special_tokens=True) == theirs.detokenize(ids).decode()
