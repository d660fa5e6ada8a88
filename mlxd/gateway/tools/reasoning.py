"""The reasoning splitter: one choice's streamed output cut into thinking text and answer text.

A thinking model writes ``<think>reasoning</think>answer`` (Qwen3, DeepSeek-R1, SmolLM3; the
markers are the worker's, from its tokenizer: ``TokenDelta.thinking`` on the first delta). A
template whose generation prompt already opens ``<think>`` makes the output start inside
thinking, with no opening marker (``Thinking.inside``). Text that may be the start of a marker
is held back until the next piece shows whether it is one, so a marker split across deltas is
never shown. Whitespace around the markers (Qwen3's ``<think>\\n``, ``</think>\\n\\n``) is dropped.

``ReasoningSplitter.tokens`` counts the output tokens of the thinking (``reasoning_tokens`` in
the OpenAI APIs' usage): those of every delta from the start of the output through the one that
closes thinking, when the output thinks at all (a delta that holds back a piece of the opening
marker counts once the marker is seen whole).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.protocol.messages import Thinking, TokenDelta


@dataclass(frozen=True, slots=True)
class Split:
    """New text of one choice: what belongs to its thinking, and what to its answer (in that
    order when a piece holds both: thinking always ends before the answer it precedes)."""

    reasoning: str = ""
    answer: str = ""


class ReasoningSplitter:
    """Follows one choice's output; ``delta`` (or ``feed``) each piece, ``finish`` at its end."""

    def __init__(self, marks: Thinking | None = None) -> None:
        self.marks: Thinking | None = None
        self.inside = False
        self._held = ""  # text that may begin a marker, or whitespace that may precede one
        self._trim = False  # drop the whitespace that follows a marker
        self.tokens = 0  # output tokens inside thinking (the markers' included)
        self._pending = 0  # tokens before the answer began, not yet known to be thinking
        self.begin(marks)

    # Public API

    def begin(self, marks: Thinking | None) -> None:
        """Set the markers (before the first piece; None: the output has no thinking)."""
        self.marks = marks
        self.inside = self._trim = marks is not None and marks.inside

    def delta(self, delta: TokenDelta) -> Split:
        """Split one worker delta; its ``thinking`` (the first delta's) sets the markers."""
        if delta.thinking is not None and self.marks is None:
            self.begin(delta.thinking)
        was_inside = self.inside
        split = self.feed(delta.text)
        self._count(len(delta.token_ids), was_inside or self.inside or bool(split.reasoning))
        if split.answer:
            self._pending = -1  # the answer began: nothing after it is thinking
        return split

    def feed(self, text: str) -> Split:
        """Split ``text``, the next piece of the output."""
        if self.marks is None:
            return Split(answer=text)
        reasoning: list[str] = []
        answer: list[str] = []
        rest = self._held + text
        self._held = ""
        while rest:
            rest = self._step(rest, reasoning, answer)
        return Split("".join(reasoning), "".join(answer))

    def finish(self) -> Split:
        """The text held back at the end of the output (an unfinished marker is plain text)."""
        held, self._held = self._held, ""
        if self.inside:
            return Split(reasoning=held.rstrip())
        return Split(answer=held)

    # Internal helpers

    def _count(self, n: int, thinking: bool) -> None:
        """Count ``n`` tokens of a delta that was (or may have been) part of thinking."""
        if thinking:
            self.tokens += n + max(self._pending, 0)
            self._pending = 0
        elif self.marks is not None and self._pending >= 0:
            self._pending += n

    def _step(self, text: str, reasoning: list[str], answer: list[str]) -> str:
        """Emit ``text`` up to the next marker (switching state past it); returns the rest."""
        assert self.marks is not None
        marker = self.marks.end if self.inside else self.marks.start
        out = reasoning if self.inside else answer
        at = text.find(marker)
        if at < 0:
            keep = _held_back(text, marker, whitespace=self.inside)
            self._emit(out, text[: len(text) - keep])
            self._held = text[len(text) - keep :]
            return ""
        self._emit(out, text[:at].rstrip() if self.inside else text[:at])
        self.inside = not self.inside
        self._trim = True
        return text[at + len(marker) :]

    def _emit(self, out: list[str], text: str) -> None:
        if self._trim:
            text = text.lstrip()
            self._trim = not text
        if text:
            out.append(text)


def split_reasoning(text: str, marks: Thinking | None) -> Split:
    """A whole output split at once (a collected, non-streamed answer)."""
    splitter = ReasoningSplitter(marks)
    first, last = splitter.feed(text), splitter.finish()
    return Split(first.reasoning + last.reasoning, first.answer + last.answer)


def _held_back(text: str, marker: str, *, whitespace: bool) -> int:
    """How many characters at the end of ``text`` must wait: a proper prefix of ``marker``,
    and (inside thinking) the whitespace before it, which is dropped if the marker follows."""
    keep = 0
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            keep = n
            break
    if whitespace:
        body = text[: len(text) - keep]
        keep += len(body) - len(body.rstrip())
    return keep
