from __future__ import annotations

from mlxd.worker.sampling.detokenizer import OutputText


class CharDetokenizer:
    """Stands in for mlx-lm's streaming detokenizer: token id = one character (outer edge)."""

    def __init__(self) -> None:
        self.text = ""

    def add_token(self, token: int) -> None:
        self.text += chr(token)

    def finalize(self) -> None:
        pass


def feed(out: OutputText, text: str) -> list[str]:
    return [out.add(ord(c)) for c in text]


def test_without_stop_strings_text_streams_at_once() -> None:
    out = OutputText(CharDetokenizer(), [])
    assert feed(out, "abc") == ["a", "b", "c"]
    assert out.finish() == ""


def test_stop_string_is_never_sent_even_in_part() -> None:
    out = OutputText(CharDetokenizer(), ["END"])
    pieces = feed(out, "hi EN")
    assert "".join(pieces) == "hi "  # "EN" is held back: it may become "END"
    pieces += feed(out, "D more")
    assert out.stopped
    assert "".join(pieces) + out.finish() == "hi "


def test_held_back_text_is_released_when_no_stop_follows() -> None:
    out = OutputText(CharDetokenizer(), ["END"])
    sent = "".join(feed(out, "hi ENx"))
    assert sent + out.finish() == "hi ENx"


def test_earliest_of_several_stop_strings_wins() -> None:
    out = OutputText(CharDetokenizer(), ["zz", "b"])
    sent = "".join(feed(out, "abzz"))
    assert out.stopped and sent == "a"
    assert out.matched_stop == "b"


def test_no_matched_stop_without_a_stop() -> None:
    out = OutputText(CharDetokenizer(), ["END"])
    feed(out, "hi")
    out.finish()
    assert out.matched_stop is None
