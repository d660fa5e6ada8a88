"""A vision-language checkpoint loaded through mlx-vlm, its language model shaped for the runners.

The runners drive an mlx-lm ``Model``: ``model(tokens, cache=...)`` gives logits, ``layers``
and ``args`` describe it. ``TextModel`` gives a VLM's language model that shape (plus
``input_embeddings``, where a prefill chunk's image features come in), so a VLM is served by the
same paged runner, batch and prefix cache as a text model; the vision tower stays beside it in
``ImageEncoder``. mlx-vlm is imported only when a VLM is served (the ``vision`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def is_vlm(path: str | Path) -> bool:
    """Whether the model directory at ``path`` is a vision-language checkpoint (its config has
    a ``vision_config``)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return isinstance(json.loads(config.read_text(encoding="utf-8")).get("vision_config"), dict)


class TextModel(nn.Module):
    """A VLM's language model as the runners call an mlx-lm model."""

    def __init__(self, language_model: nn.Module) -> None:
        super().__init__()
        self.language_model = language_model

    def __call__(
        self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None
    ) -> mx.array:
        out = self.language_model(inputs, cache=cache, inputs_embeds=input_embeddings)
        return out.logits  # type: ignore[no-any-return]

    @property
    def layers(self) -> list[nn.Module]:
        return self.language_model.layers  # type: ignore[no-any-return]

    @property
    def model(self) -> nn.Module:
        """The decoder (``embed_tokens``, as mlx-lm models name it); Idefics3's language model
        is its own decoder (``embed_tokens`` and ``layers`` beside ``lm_head``)."""
        return getattr(self.language_model, "model", self.language_model)  # type: ignore[no-any-return]

    @property
    def lm_head(self) -> Any:
        return getattr(self.language_model, "lm_head", None)

    @property
    def args(self) -> Any:
        """The text config (heads, hidden size, vocabulary, context), as mlx-lm's ``args``."""
        return self.language_model.config

    def make_cache(self) -> list[Any]:
        """One sequence's caches as the language model lays them out: Gemma 3's window layers
        keep rotating caches beside its full layers' plain ones, which puts it on the window
        runner (``layer_caches.window_size``); a model without its own gets a plain K/V cache
        per layer, as mlx-lm gives one."""
        own = getattr(self.language_model, "make_cache", None)
        if own is not None:
            return list(own())
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]

    def embed(self, tokens: mx.array) -> mx.array:
        """The token embeddings the decoder starts from."""
        return self.model.embed_tokens(tokens)  # type: ignore[no-any-return]


def load_vlm(path: str) -> tuple[TextModel, Any, Any]:
    """(the language model for the runners, mlx-lm's tokenizer wrapper, the whole mlx-vlm
    model with its processor) from the VLM directory ``path``."""
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm.utils import load

    vlm, processor = load(path)
    vlm.eval()
    if getattr(vlm.config, "model_type", None) == "llama4":
        from mlxd.worker.vision.llama4 import add_global_tiles

        add_global_tiles(processor)  # mlx-vlm's leaves each tiled image's global tile out
    tokenizer = load_tokenizer(Path(path), eos_token_ids=getattr(vlm.config, "eos_token_id", None))
    return _text_model(vlm.language_model, vlm.config), tokenizer, (vlm, processor)


def _text_model(language_model: nn.Module, config: Any = None) -> TextModel:
    """The runners' view of ``language_model``: Qwen-VL's takes its multimodal positions,
    Qwen3-VL's its deepstack features too, and Qwen3.5's (recurrent layers beside them) runs
    its layers itself (``vision.hybrid``); Mistral 3's (Ministral 3) scales each row's queries
    by its own positions; Llama 4's serves a context within one attention chunk; Gemma 4's
    scales its embeddings and reads image placeholders as token 0 for its per-layer inputs."""
    from mlxd.worker.vision.deepstack import DeepstackTextModel, takes_deepstack
    from mlxd.worker.vision.mrope import MRopeTextModel

    if takes_deepstack(language_model):  # Qwen3-VL: mRoPE and deepstack features
        return DeepstackTextModel(language_model)
    model_type = getattr(language_model, "model_type", None)
    if model_type == "gemma4_text":
        from mlxd.worker.vision.gemma4 import Gemma4TextModel

        return Gemma4TextModel(language_model, config)
    if model_type == "llama4_text":
        from mlxd.worker.vision.llama4 import Llama4TextModel

        return Llama4TextModel(language_model)
    if model_type == "ministral3":
        from mlxd.worker.vision.ministral3 import scale_rows

        scale_rows(language_model)
    if hasattr(language_model, "get_rope_index"):
        if _has_recurrent_layers(language_model):
            from mlxd.worker.vision.hybrid import HybridMRopeTextModel

            return HybridMRopeTextModel(language_model)
        return MRopeTextModel(language_model)
    return TextModel(language_model)


def _has_recurrent_layers(language_model: nn.Module) -> bool:
    """Whether the model's caches hold recurrent state (``ArraysCache``) beside K/V."""
    own = getattr(language_model, "make_cache", None)
    return own is not None and any(type(c).__name__ == "ArraysCache" for c in own())
