"""A model's context and vocabulary come from its config, or its wrapped text config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxd.worker.main import DEFAULT_CONTEXT, _model_context, model_vocab_size

pytestmark = pytest.mark.model


def test_wrapped_text_configs_give_the_context_and_vocabulary() -> None:
    """Qwen3.5, Gemma 3 and Mistral 3 keep them in ``text_config``: a 4,000-token prompt to a
    262k-context Qwen3.5 was refused as over 4,096 tokens."""
    text = {"max_position_embeddings": 262144, "vocab_size": 248320}
    wrapped = SimpleNamespace(args=SimpleNamespace(text_config=text))
    plain = SimpleNamespace(args=SimpleNamespace(max_position_embeddings=40960, vocab_size=99))
    assert _model_context(wrapped) == 262144 and model_vocab_size(wrapped, []) == 248320
    assert _model_context(plain) == 40960 and model_vocab_size(plain, []) == 99
    assert _model_context(SimpleNamespace()) == DEFAULT_CONTEXT
