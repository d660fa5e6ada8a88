"""`mlxd run MODEL` without a prompt: an interactive chat in the terminal, as `ollama run` has.

The conversation is kept and sent whole each turn, so the model sees the history. Input lines
have readline editing and history (up arrow) where Python has readline. ``\"\"\"`` starts and ends
a multi-line message. Ctrl-C during an answer stops that answer (its partial text stays in the
history) and the session goes on; at the prompt it says how to leave: ``/bye`` or Ctrl-D.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator

import click

Messages = list[dict[str, str]]
Send = Callable[[Messages], Iterator[str]]

PROMPT, CONTINUATION, FENCE = ">>> ", "... ", '"""'
HELP = (
    "Commands: /bye (or Ctrl-D) leaves, /clear forgets the conversation, /? shows this. "
    f"Start and end a multi-line message with {FENCE}. Ctrl-C stops an answer."
)


class ChatSession:
    """The read-answer loop of one terminal chat.

    Args:
        send: streams the answer to a conversation, piece by piece (``chat_stream.stream_chat``).
        system: a system message to start every conversation with.
    """

    def __init__(self, send: Send, system: str | None = None) -> None:
        self.send = send
        self.system = system
        self.messages: Messages = []
        self.clear()

    def run(self) -> None:
        """Chat until ``/bye`` or end of input."""
        _enable_line_editing()
        click.echo("Send a message (/? for help, /bye to leave)", err=True)
        while True:
            try:
                text = self._read()
            except EOFError:
                click.echo(err=True)
                return
            except KeyboardInterrupt:
                click.echo("\nUse Ctrl-D or /bye to leave.", err=True)
                continue
            if text.strip() == "/bye":
                return
            if text.strip():
                self._dispatch(text)

    def clear(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    # Internal helpers

    def _dispatch(self, text: str) -> None:
        command = text.strip()
        if command in ("/?", "/help"):
            click.echo(HELP, err=True)
        elif command == "/clear":
            self.clear()
            click.echo("Cleared the conversation.", err=True)
        elif command.startswith("/") and " " not in command and "\n" not in command:
            click.echo(f"Unknown command {command!r}: /? lists them.", err=True)
        else:
            self._answer(text)

    def _answer(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        try:
            for piece in self.send(self.messages):
                pieces.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            click.echo("\n(stopped)", err=True)
        except click.ClickException as exc:
            click.echo(f"\nerror: {exc.message}", err=True)
            self.messages.pop()
            return
        click.echo()
        self.messages.append({"role": "assistant", "content": "".join(pieces)})

    def _read(self) -> str:
        first = input(PROMPT)
        if not first.lstrip().startswith(FENCE):
            return first
        lines = [first.lstrip()[len(FENCE) :]]
        while not lines[-1].rstrip().endswith(FENCE) or len(lines) == 1 and lines[0] == "":
            lines.append(input(CONTINUATION))
        lines[-1] = lines[-1].rstrip()[: -len(FENCE)]
        return "\n".join(lines).strip("\n")


def _enable_line_editing() -> None:
    # Importing readline gives input() line editing and history; some Pythons are built without.
    if importlib.util.find_spec("readline") is not None:
        importlib.import_module("readline")
