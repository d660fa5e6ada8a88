"""`mlxd run` in a real terminal (tmux): one-shot, the interactive chat, Ctrl-C; and in pipes.

Answers are greedy (``--temperature 0``), so each is compared with the same request sent over
HTTP. The tiny model's tokens are random text: comparisons keep only ASCII letters and digits,
which survive the terminal's wrapping and rendering.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, free_port, logged_lines, start_daemon, stop_daemon

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

LONG = 3000  # tokens: an answer still streaming when Ctrl-C comes (~225 tok/s here)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("run")
    config = home / "mlxd.toml"
    config.write_text(f'[models.lazy]\npath = "{tiny_model}"\npreload = false\n')
    d = start_daemon(
        tiny_model, "--config", str(config), "--request-log", str(home / "requests.log")
    )
    d.request_log = home / "requests.log"  # type: ignore[attr-defined]
    yield d
    stop_daemon(d)


class Terminal:
    """A tmux server of our own running one command in a 200x50 pane.

    The pane keeps 100,000 lines of history and `text` reads all of it: a random model's answer
    can be hundreds of short lines, which would scroll an earlier turn's marks out of a short
    capture.
    """

    def __init__(self, command: list[str]) -> None:
        self.socket = f"mlxd-test-{os.getpid()}-{time.monotonic_ns()}"
        line = " ".join(f"'{a}'" for a in command) + "; echo EXITED=$?; sleep 60"
        self._tmux(
            *("start-server", ";", "set-option", "-g", "history-limit", "100000", ";"),
            *("new-session", "-d", "-x", "200", "-y", "50", f"cd {os.getcwd()} && {line}"),
        )

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", *keys)

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-S", "-").stdout

    def wait_for(self, needle: str, count: int = 1, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (screen := self.text()).count(needle) >= count:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} (x{count}) not on the screen:\n{self.text()}")

    def wait_for_answer(self, after: str, timeout: float = 60) -> None:
        """Wait until text is printed below the last line that holds `after`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            below = self.text().rpartition(after)[2].partition("\n")[2]
            if below.strip():
                return
            time.sleep(0.05)
        raise AssertionError(f"no answer after {after!r}:\n{self.text()}")

    def close(self) -> None:
        self._tmux("kill-server")

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False
        )


@pytest.fixture
def terminal() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for t in opened:
        t.close()


def mlxd_run(d: Daemon, *args: str) -> list[str]:
    return [sys.executable, "-m", "mlxd", "run", "--url", d.base_url, "--temperature", "0", *args]


def greedy(d: Daemon, messages: list[dict[str, str]], max_tokens: int = 8) -> str:
    body = {"model": d.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{d.base_url}/v1/chat/completions", json=body, timeout=60)
    return str(r.json()["choices"][0]["message"]["content"])


def plain(text: str) -> str:
    return "".join(c for c in text if c.isascii() and c.isalnum())


def chats(d: Daemon, since: int) -> list[dict[str, object]]:
    lines = logged_lines(d.request_log)[since:]  # type: ignore[attr-defined]
    return [x for x in lines if x["endpoint"] == "/v1/chat/completions"]


def test_one_shot_in_a_terminal_prints_the_answer_and_exits(
    served: Daemon, terminal: list[Terminal]
) -> None:
    t = Terminal(mlxd_run(served, served.model, "Why", "is the sky blue?", "--max-tokens", "8"))
    terminal.append(t)
    screen = t.wait_for("EXITED=")
    assert "EXITED=0" in screen
    expected = greedy(served, [{"role": "user", "content": "Why is the sky blue?"}])
    assert plain(expected) and plain(expected) in plain(screen.split("EXITED")[0])


def test_one_shot_in_a_pipe_reads_stdin_and_writes_only_the_answer(served: Daemon) -> None:
    r = subprocess.run(
        mlxd_run(served, served.model, "--max-tokens", "8"),
        input="Hello!",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == greedy(served, [{"role": "user", "content": "Hello!"}]) + "\n"


def test_interactive_chat_keeps_the_history_and_takes_multi_line_input(
    served: Daemon, terminal: list[Terminal]
) -> None:
    t = Terminal(mlxd_run(served, served.model, "--max-tokens", "8"))
    terminal.append(t)
    t.wait_for(">>>")
    t.send("Hello", "Enter")
    t.wait_for(">>>", count=2)
    t.send('"""first line', "Enter", 'second line"""', "Enter")
    t.wait_for(">>>", count=3)
    t.send("/bye", "Enter")
    screen = t.wait_for("EXITED=")
    first = greedy(served, [{"role": "user", "content": "Hello"}])
    history = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "first line\nsecond line"},
    ]
    second = greedy(served, history)
    assert "... second line" in screen and "EXITED=0" in screen
    assert plain(first) in plain(screen) and plain(second) in plain(screen)
    assert plain(second) != plain(greedy(served, history[2:]))  # the history made a difference


def test_ctrl_c_stops_the_answer_not_the_session(served: Daemon, terminal: list[Terminal]) -> None:
    since = len(logged_lines(served.request_log))  # type: ignore[attr-defined]
    t = Terminal(mlxd_run(served, served.model, "--max-tokens", str(LONG)))
    terminal.append(t)
    t.wait_for(">>>")
    for turn in (1, 2):  # the session goes on after a stopped answer
        asked = f"Tell me a long story {turn}"
        t.send(asked, "Enter")
        t.wait_for_answer(after=asked)  # streaming has begun (a loaded CI can take seconds)
        time.sleep(0.5)
        t.send("C-c")
        t.wait_for("(stopped)", count=turn)
        t.wait_for(">>>", count=turn + 1)
    t.send("C-c")  # at the prompt: a hint, the session stays
    t.wait_for("Use Ctrl-D or /bye to leave.")
    t.send("C-d")
    assert "EXITED=0" in t.wait_for("EXITED=")
    deadline = time.monotonic() + 10
    while len(done := chats(served, since)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    # Both answers streamed, and the daemon stopped each (its client went away) long before
    # LONG tokens: Ctrl-C cancels the request, not just the printing.
    assert [x["status"] for x in done] == [200, 200]
    tokens = [int(str(x["completion_tokens"])) for x in done]
    assert all(0 < n < LONG // 2 for n in tokens), tokens  # which bound, if it fails


def test_a_model_not_loaded_is_loaded_first_with_progress(served: Daemon) -> None:
    r = subprocess.run(
        mlxd_run(served, "lazy", "hi", "--max-tokens", "2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "mlxd: loading lazy" in r.stderr and "lazy loaded in" in r.stderr and r.stdout.strip()


def test_an_unknown_model_is_one_line_that_lists_the_served_ones(served: Daemon) -> None:
    r = subprocess.run(mlxd_run(served, "nope", "hi"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and not r.stdout
    assert r.stderr.strip() == (
        f"Error: mlxd at {served.base_url} does not serve 'nope'; it serves: lazy, tiny"
    )


def test_starts_the_daemon_in_the_background_when_none_runs(
    tiny_model: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    env["MLXD_HOME"] = str(tmp_path / "home")
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "run",
        "--url",
        url,
        str(tiny_model),
        "hi",
        "--max-tokens",
        "4",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    stop = subprocess.run(
        [sys.executable, "-m", "mlxd", "stop"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    assert f"no mlxd at {url}: starting one in the background" in r.stderr
    assert f"mlxd is running at {url}" in r.stderr  # the start's own lines, on stderr
    # the answer only (the random model's answer may hold a newline): no start lines on stdout
    assert r.stdout.strip() and "background" not in r.stdout and "running at" not in r.stdout
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stderr
