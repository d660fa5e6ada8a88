"""`mlxd run MODEL [PROMPT]`: one answer on stdout, or an interactive chat, as `ollama run`.

With no daemon at the URL it starts one in the background (`mlxd start --detach --model MODEL`,
its progress on stderr) and says so; it stays running for later commands (`mlxd stop` ends it).
A model that is not loaded yet is loaded first, with progress. Only the answer goes to stdout,
so `mlxd run MODEL "..." > file` and `echo ... | mlxd run MODEL` work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import click

from mlxd.cli.admin import AdminClient
from mlxd.cli.chat_session import ChatSession, Messages
from mlxd.cli.chat_stream import stream_chat
from mlxd.cli.service import DONE_STATES, PROGRESS_EVERY_S, locate
from mlxd.config import data_dir

LOAD_TIMEOUT_S = 900.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command("run")
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option(
    "--url",
    default=None,
    envvar="MLXD_URL",
    help="The daemon (env MLXD_URL; default: the one started with --detach, else "
    "http://127.0.0.1:8000). A local one is started there if none answers.",
)
@click.option(
    "--api-key",
    default=None,
    metavar="KEY",
    envvar="MLXD_API_KEY",
    help="Sent as 'Authorization: Bearer KEY' (env MLXD_API_KEY).",
)
@click.option(
    "--admin-key",
    default=None,
    metavar="KEY",
    envvar="MLXD_ADMIN_KEY",
    help="To load the model first (env MLXD_ADMIN_KEY).",
)
@click.option("--system", default=None, help="A system message.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Most tokens per answer (default: the model's context).",
)
@click.option("--temperature", type=click.FloatRange(0.0, 2.0), default=None)
def run_command(
    model: str,
    prompt: tuple[str, ...],
    url: str | None,
    api_key: str | None,
    admin_key: str | None,
    system: str | None,
    max_tokens: int | None,
    temperature: float | None,
) -> None:
    """Chat with MODEL: PROMPT's answer, else stdin's when piped, else an interactive chat.

    \b
    In the chat: /bye or Ctrl-D leaves, /clear forgets the conversation, \"\"\" starts and
    ends a multi-line message, Ctrl-C stops the current answer.
    """
    url = locate(url)[0]
    if not _answers(url):
        _start_daemon(url, model)
    name = _served_name(url, model, api_key)
    _wait_loaded(AdminClient(url, admin_key), name)
    options = {"max_tokens": max_tokens, "temperature": temperature}
    body = {"model": name, **{k: v for k, v in options.items() if v is not None}}

    def send(messages: Messages) -> Iterator[str]:
        return stream_chat(url, {**body, "messages": messages}, api_key)

    if prompt or not sys.stdin.isatty():
        _answer_once(send, system, " ".join(prompt) if prompt else sys.stdin.read())
    else:
        ChatSession(send, system).run()


# Internal helpers


def _answer_once(send: Any, system: str | None, text: str) -> None:
    if not text.strip():
        raise click.ClickException("no prompt: give one after MODEL or on stdin")
    messages = [{"role": "system", "content": system}] if system else []
    try:
        for piece in send([*messages, {"role": "user", "content": text}]):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        click.echo(err=True)
        sys.exit(130)
    sys.stdout.write("\n")


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: a degraded daemon still runs)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):  # noqa: S310 - our URL
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _start_daemon(url: str, model: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    if host not in _LOOPBACK:
        raise click.ClickException(f"cannot reach mlxd at {url} (only a local one is started)")
    _progress(
        f"no mlxd at {url}: starting one in the background (mlxd start --detach --model "
        f"{model}); `mlxd stop` stops it"
    )
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--detach",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
    ]
    # Its progress and its "running at" line go to our stderr: stdout is for the answer only.
    code = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False).returncode
    if code != 0:
        raise click.ClickException(
            f"could not start mlxd (exit {code}); see {data_dir() / 'mlxd.log'}"
        )


def _served_name(url: str, model: str, api_key: str | None) -> str:
    """The name the daemon serves ``model`` under: as given, ``NAME=``'s name, or a path's."""
    names = [str(m["id"]) for m in _get_json(url, "/v1/models", api_key)["data"]]
    candidates = [model, model.partition("=")[0], Path(model).expanduser().name]
    for name in candidates:
        if name in names:
            return name
    if _is_alias(url, model, api_key):
        return model
    raise click.ClickException(
        f"mlxd at {url} does not serve {model!r}; it serves: {', '.join(names) or 'nothing'}"
    )


def _is_alias(url: str, model: str, api_key: str | None) -> bool:
    try:
        _get_json(url, f"/v1/models/{quote(model, safe='')}", api_key)
    except click.ClickException:
        return False
    return True


def _get_json(url: str, path: str, api_key: str | None) -> dict[str, Any]:
    """A GET of the OpenAI API (``AdminClient`` speaks to /admin/*, maybe over a Unix socket)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - our URL
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"mlxd at {url} answered {path} with HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot reach mlxd at {url}: {exc}") from None


def _wait_loaded(client: AdminClient, name: str) -> None:
    """Load ``name`` now, with progress, unless it is ready; without admin access, the first
    request waits for the load instead."""
    try:
        info = _model_info(client, name)
        if info["state"] in ("ready", "running"):
            return
        info = client.post(AdminClient.model_path(name, "load"), {"wait": False})
    except click.ClickException:
        return  # no admin access (a remote daemon without --admin-key): the request waits
    started = last_note = time.monotonic()
    _progress(f"loading {name} ...")
    while info["state"] not in DONE_STATES:
        if time.monotonic() - started > LOAD_TIMEOUT_S:
            raise click.ClickException(
                f"{name} is still {info['state']} after {LOAD_TIMEOUT_S:g} s"
            )
        if time.monotonic() - last_note >= PROGRESS_EVERY_S:
            _progress(
                f"loading {name}: {' '.join(filter(None, (info['state'], info.get('progress'))))}"
                f" ({time.monotonic() - started:.0f} s)"
            )
            last_note = time.monotonic()
        time.sleep(0.2)
        info = _model_info(client, name)
    if info["state"] != "ready":
        raise click.ClickException(f"{name} did not load: {info['state']}: {info['last_error']}")
    _progress(f"{name} loaded in {time.monotonic() - started:.1f} s")


def _model_info(client: AdminClient, name: str) -> dict[str, Any]:
    for model in client.get("/admin/status")["models"]:
        if name == model["name"] or name in (model.get("aliases") or []):
            return dict(model)
    raise click.ClickException(f"the daemon does not list {name!r}")


def _progress(line: str) -> None:
    click.echo(f"mlxd: {line}", err=True)
