"""Prompt-lookup drafts: the tokens that followed the last earlier occurrence of a sequence's
trailing n-gram in its own prompt and output.

A code edit, a JSON reformat or a quoted answer copies long runs of its prompt, so the tokens
after the previous occurrence of the last few tokens are often the next ones (measured on
SmolLM2-135M, issue #20: 2.7 tokens per forward with 4-token drafts on an edit task, 1.18 on
free chat). No model runs: the index grows by O(new tokens) per step and a lookup is a dict
access, so a batch of 64 long rows costs microseconds of host time per step.

Pure Python, no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

MAX_N = 3  # longest n-gram looked up; shorter ones are tried when it has no earlier occurrence
MIN_N = 1


class NgramIndex:
    """For each n in ``MIN_N..MAX_N``: every n-gram of one token list that has a continuation,
    mapped to where its last such occurrence ends (the continuation's index)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_N, MAX_N + 1)}

    def sync(self, prompt: Seq[int], output: Seq[int]) -> None:
        """Follow ``prompt + output``, which extend the tokens indexed (without building the
        concatenation: it is the whole context, every step)."""
        for token in prompt[len(self.tokens) :]:
            self._append(token)
        for token in output[len(self.tokens) - len(prompt) :]:
            self._append(token)

    def propose(self, k: int) -> list[int]:
        """``k`` tokens that followed the last earlier occurrence of the longest trailing
        n-gram that occurred before (none: ``[]``). When that occurrence is less than ``k``
        tokens back, the tokens since repeat with that period (a loop, a repeated line)."""
        t, length = self.tokens, len(self.tokens)
        if k <= 0:
            return []
        for n in range(MAX_N, MIN_N - 1, -1):
            if length < n:
                continue
            end = self._ends[n].get(tuple(t[length - n :]))
            if end is not None:
                period = length - end
                return [t[end + i % period] for i in range(k)]
        return []

    def _append(self, token: int) -> None:
        # The n-grams ending at the current end get a continuation now: ``token``.
        t, length = self.tokens, len(self.tokens)
        for n, ends in self._ends.items():
            if length >= n:
                ends[tuple(t[length - n :])] = length
        t.append(token)
