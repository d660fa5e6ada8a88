"""Prompts to token ids with the model's own tokenizer and chat template."""

from __future__ import annotations

import functools
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import ChatPrompt, Prompt, TextPrompt, Thinking, TokenPrompt


class PromptEncoder:
    """Wraps mlx-lm's ``TokenizerWrapper``: renders chats, encodes text, checks token ids."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_tokens: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens  # the context: longer texts are refused before encoding

    @functools.cached_property
    def max_token_chars(self) -> int | None:
        """The longest token's length in characters (None if the vocabulary is unknown).

        A text of ``c`` characters has at least ``c / max_token_chars`` tokens, so a prompt far
        beyond the context is refused without tokenizing megabytes.
        """
        get_vocab = getattr(getattr(self.tokenizer, "_tokenizer", None), "get_vocab", None)
        vocab = get_vocab() if callable(get_vocab) else None
        return max(map(len, vocab), default=None) if vocab else None

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids)

    @property
    def tool_parser(self) -> str | None:
        """The name of mlx-lm's tool parser module for this tokenizer (e.g. "json_tools")."""
        parse = getattr(self.tokenizer, "tool_parser", None)
        return None if parse is None else str(parse.__module__).rsplit(".", 1)[-1]

    @property
    def think_ids(self) -> tuple[int, int] | None:
        """The thinking start and end markers' token ids, when each is one token (else None)."""
        start = getattr(self.tokenizer, "think_start_tokens", None)
        end = getattr(self.tokenizer, "think_end_tokens", None)
        if start is None or end is None or len(start) != 1 or len(end) != 1:
            return None
        return start[0], end[0]

    def thinking(self, prompt_ids: list[int]) -> Thinking | None:
        """How the output of ``prompt_ids`` marks thinking; None for a model without markers.

        The output starts inside thinking when the prompt's last start marker follows its last
        end marker (a generation prompt that opens ``<think>``), as mlx-lm's server decides.
        """
        tok = self.tokenizer
        if not getattr(tok, "has_thinking", False):
            return None  # no markers in the vocabulary, or an mlx-lm without thinking support
        inside = tok.rfind_think_start(prompt_ids) > tok.rfind_think_end(prompt_ids)
        return Thinking(start=tok.think_start, end=tok.think_end, inside=inside)

    def new_detokenizer(self) -> Any:
        return self.tokenizer.detokenizer

    @functools.cached_property
    def ll_tokenizer(self) -> Any:
        """The vocabulary as llguidance sees it (exact token bytes, grammar masks); built on
        first use, as it costs about a second for a large vocabulary."""
        import llguidance.hf

        return llguidance.hf.from_tokenizer(
            self.tokenizer._tokenizer,
            n_vocab=self.vocab_size,
            eos_token=sorted(self.eos_token_ids)[0],
        )

    def token_vocab(self, param: str) -> Any:
        """``ll_tokenizer``, or ``InvalidRequest`` naming ``param`` (the feature that needs it)
        when this model's tokenizer cannot give one (llguidance takes fast tokenizers only)."""
        try:
            return self.ll_tokenizer
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidRequest(
                f"'{param}' is not available for this model's tokenizer: {exc}", param=param
            ) from None

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token (a token may hold part of a UTF-8 character)."""
        return bytes(self.ll_tokenizer.decode_bytes([token_id]))

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids for ``prompt``; ``InvalidRequest`` when it cannot be rendered or is empty."""
        if isinstance(prompt, ChatPrompt):
            ids = self._encode_chat(prompt)
            param = "messages"
        elif isinstance(prompt, TextPrompt):
            self._check_length(prompt.text, "prompt")
            ids = self.tokenizer.encode(prompt.text)
            param = "prompt"
        else:
            ids = self._check_ids(prompt)
            param = "prompt"
        if not ids:
            raise InvalidRequest("the prompt is empty", param=param)
        return list(ids)

    def _encode_chat(self, prompt: ChatPrompt) -> list[int]:
        text = self.render_chat(prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_chat(self, prompt: ChatPrompt) -> str:
        """``prompt`` through the chat template, as text (a VLM's processor tokenizes it with
        its images); ``InvalidRequest`` when the template refuses it or it is far too long."""
        # The switch only when the client set it: mlx-lm's wrapper (and the template) default.
        switch = {} if prompt.thinking is None else {"enable_thinking": prompt.thinking}
        try:
            text = self.tokenizer.apply_chat_template(
                prompt.messages,
                tools=prompt.tools,
                add_generation_prompt=True,
                tokenize=False,
                **switch,
            )
        except Exception as exc:  # noqa: BLE001 - Jinja raises anything; the request is bad
            raise InvalidRequest(
                f"cannot apply the chat template: {exc}", param="messages"
            ) from None
        self._check_length(text, "messages")
        return str(text)

    def _check_length(self, text: str, param: str) -> None:
        longest = self.max_token_chars
        if self.max_tokens is None or longest is None:
            return
        at_least = len(text) // longest
        if at_least > self.max_tokens:
            raise InvalidRequest(
                f"the prompt has at least {at_least} tokens; this model's context is "
                f"{self.max_tokens} tokens",
                param=param,
            )

    def _check_ids(self, prompt: TokenPrompt) -> list[int]:
        bad = [t for t in prompt.token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})",
                param="prompt",
            )
        return prompt.token_ids
