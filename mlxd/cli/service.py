"""`mlxd status`, `mlxd stop`, `mlxd load MODEL`, `mlxd unload MODEL`: the daemon as a service.

They find the daemon through ``--url``/``MLXD_URL``, else the detached daemon's record in the
data dir, else ``http://127.0.0.1:8000``. Human output by default, ``--json`` for scripts; a
failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from mlxd.cli.admin import DEFAULT_URL, OVERVIEW_PATH, AdminClient, format_bytes, print_json
from mlxd.config import data_dir
from mlxd.daemon.daemon_files import DaemonFiles, DaemonRecord, is_mlxd

_F = TypeVar("_F", bound=Callable[..., Any])

PROGRESS_EVERY_S = 2.0
DONE_STATES = ("ready", "failed", "stopped", "unloaded")


def with_service_options(fn: _F) -> _F:
    """--url (default: the detached daemon's, else 127.0.0.1:8000), --admin-key, --json."""
    options = [
        click.option(
            "--url",
            default=None,
            envvar="MLXD_URL",
            help=f"The daemon (env MLXD_URL; default: the one started with --detach, "
            f"else {DEFAULT_URL}).",
        ),
        click.option(
            "--admin-key",
            default=None,
            metavar="KEY",
            envvar="MLXD_ADMIN_KEY",
            help="Sent as 'Authorization: Bearer KEY' (env MLXD_ADMIN_KEY).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def locate(url: str | None) -> tuple[str, DaemonRecord | None]:
    """The daemon's URL and, when it is the data dir's detached daemon, its record."""
    record = DaemonFiles(data_dir()).running()
    if url:
        return url.rstrip("/"), record if record is not None and record.url == url else None
    if record is not None and record.url:
        return record.url, record
    return DEFAULT_URL, None


@click.command("status")
@with_service_options
def status_command(url: str | None, admin_key: str | None, as_json: bool) -> None:
    """Is mlxd running? Where, since when, and its models."""
    url, record = locate(url)
    login = _login_service()
    try:
        body = AdminClient(url, admin_key).get(OVERVIEW_PATH)
    except click.ClickException as exc:
        if as_json:
            print_json({"running": False, "url": url, "error": exc.message, "login_service": login})
        else:
            click.echo(_login_line(login))
        raise click.ClickException(f"mlxd is not running at {url} ({exc.message})") from None
    out = {
        "running": True,
        "url": url,
        "pid": body["pid"],
        "version": body["version"],
        "uptime_s": body["uptime_s"],
        "detached": record is not None,
        "log_file": None if record is None else record.log_file,
        "memory": body.get("memory"),
        "models": body["models"],
        "health": body.get("health"),
        "login_service": login,
    }
    print_json(out) if as_json else _show_status(out)


@click.command("stop")
@click.option("--force", is_flag=True, help="Kill at once (SIGKILL), workers too; no draining.")
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for a graceful stop.",
)
@with_service_options
def stop_command(
    force: bool, timeout: float, url: str | None, admin_key: str | None, as_json: bool
) -> None:
    """Stop the daemon: it finishes the requests in flight, then stops its workers."""
    url, record = locate(url)
    pid, workers = _daemon_pids(url, admin_key, record)
    if not is_mlxd(pid):
        raise click.ClickException(f"the daemon at {url} (pid {pid}) is not on this machine")
    started = time.monotonic()
    if force:
        for p in (pid, *workers):
            _signal(p, signal.SIGKILL)
    else:
        _progress(f"stopping mlxd (pid {pid}): finishing requests in flight, then its workers")
        _signal(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout, "stopping"):
        raise click.ClickException(
            f"mlxd (pid {pid}) did not stop within {timeout:g} s; `mlxd stop --force` kills it"
        )
    DaemonFiles(data_dir()).remove_stale()
    result = {
        "stopped": True,
        "pid": pid,
        "forced": force,
        "seconds": round(time.monotonic() - started, 2),
    }
    if as_json:
        print_json(result)
    else:
        click.echo(f"mlxd (pid {pid}) {'killed' if force else 'stopped'}")


@click.command("load")
@click.argument("model")
@click.option("--wait/--no-wait", default=True, help="Return once the model is ready (default).")
@click.option(
    "--timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds to wait for the model to be ready.",
)
@with_service_options
def load_command(
    model: str, wait: bool, timeout: float, url: str | None, admin_key: str | None, as_json: bool
) -> None:
    """Load MODEL's worker now (unloading least recently used idle ones if memory needs it)."""
    client = AdminClient(locate(url)[0], admin_key)
    info = client.post(AdminClient.model_path(model, "load"), {"wait": False})
    name, started = info["name"], time.monotonic()
    last_note = started
    while wait and info["state"] not in DONE_STATES:
        if time.monotonic() - started > timeout:
            raise click.ClickException(f"{name} is still {info['state']} after {timeout:g} s")
        if time.monotonic() - last_note >= PROGRESS_EVERY_S:
            _progress(
                f"loading {name}: {' '.join(filter(None, (info['state'], info.get('progress'))))}"
                f" ({time.monotonic() - started:.0f} s)"
            )
            last_note = time.monotonic()
        time.sleep(0.2)
        info = _model_info(client, name)
    if wait and info["state"] != "ready":
        raise click.ClickException(f"{name} did not load: {info['state']}: {info['last_error']}")
    if as_json:
        print_json(info)
        return
    took = f" in {time.monotonic() - started:.1f} s" if wait else ""
    click.echo(f"{name}: {info['state']}{took} ({format_bytes(info['memory_bytes'])} reserved)")


@click.command("unload")
@click.argument("model")
@with_service_options
def unload_command(model: str, url: str | None, admin_key: str | None, as_json: bool) -> None:
    """Unload MODEL's worker (its requests finish first); its next request loads it again."""
    if not as_json:
        _progress(f"unloading {model}: finishing its requests in flight")
    info = AdminClient(locate(url)[0], admin_key).post(AdminClient.model_path(model, "unload"))
    print_json(info) if as_json else click.echo(f"{info['name']}: {info['state']}")


# Internal helpers


def _model_info(client: AdminClient, name: str) -> dict[str, Any]:
    for model in client.get("/admin/status")["models"]:
        if model["name"] == name:
            return dict(model)
    raise click.ClickException(f"the daemon no longer lists {name!r}")


def _daemon_pids(
    url: str, admin_key: str | None, record: DaemonRecord | None
) -> tuple[int, list[int]]:
    try:
        body = AdminClient(url, admin_key).get("/admin/status")
    except click.ClickException as exc:
        if record is None:
            raise click.ClickException(f"mlxd is not running at {url} ({exc.message})") from None
        return record.pid, []  # it does not answer: signals still reach it
    return int(body["pid"]), [int(m["pid"]) for m in body["models"] if m.get("pid")]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout: float, doing: str) -> bool:
    started = last_note = time.monotonic()
    while is_mlxd(pid):
        now = time.monotonic()
        if now - started > timeout:
            return False
        if now - last_note >= PROGRESS_EVERY_S:
            _progress(f"still {doing} (pid {pid}, {now - started:.0f} s)")
            last_note = now
        time.sleep(0.1)
    return True


def _progress(line: str) -> None:
    click.echo(f"mlxd: {line}", err=True)


def _show_status(s: dict[str, Any]) -> None:
    click.echo(
        f"mlxd {s['version']} is running at {s['url']} (pid {s['pid']}, up "
        f"{_duration(s['uptime_s'])})"
    )
    if s["log_file"]:
        click.echo(f"log: {s['log_file']}")
    click.echo(_login_line(s["login_service"]))
    if s["health"]:
        click.echo(_health_line(s["health"]))
    memory = s["memory"] or {}
    reserved = format_bytes(memory.get("reserved_bytes") or 0)
    budget = memory.get("max_memory_bytes")
    click.echo(
        f"memory: {reserved} reserved"
        + (
            f" of {format_bytes(budget)} (--max-memory{_per_gpu(s)})"
            if budget
            else ", no --max-memory budget"
        )
    )
    rows = [("MODEL", "STATE", "MEMORY", "PID", "RESTARTS", "ALIASES")]
    rows += [
        (
            m["name"],
            m["state"],
            format_bytes(m.get("memory_bytes") or 0),
            str(m["pid"] or "-"),
            str(m["restarts"]),
            ", ".join(m.get("aliases") or []) or "-",
        )
        for m in s["models"]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for m in s["models"]:
        if m["state"] == "failed":
            click.echo(
                f"{m['name']} failed: {m['last_error']} (`mlxd load {m['name']}` tries again)"
            )


def _health_line(health: dict[str, Any]) -> str:
    """Liveness (``/health``) and which models or backends are not ready (``/health/ready``)."""
    ready = [m["model"] for m in health["models"] if m["ready"]]
    ready += [b["backend"] for b in health["backends"] if b["ready"]]
    failed = [f.get("model") or f.get("backend") for f in health["failed"]]
    line = f"health: {health['status']} (ready: {', '.join(ready) or 'none'}"
    return line + (f"; not ready: {', '.join(failed)})" if failed else ")")


def _login_service() -> dict[str, Any]:
    from mlxd.cli.login_service import login_service

    service = login_service()
    return {
        "installed": service.path.exists(),
        "path": str(service.path),
        "platform": service.platform,
    }


def _login_line(login: dict[str, Any]) -> str:
    if login["installed"]:
        return f"login service: installed ({login['path']}; `mlxd service uninstall` removes it)"
    return "login service: not installed (`mlxd service install` starts mlxd at login)"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _per_gpu(status: dict[str, Any]) -> str:
    """ ", each GPU's" when the workers are placed on several GPUs (each has that budget)."""
    placed = {g for m in status.get("models", []) for g in (m.get("gpus") or "").split(",") if g}
    return ", each GPU's" if len(placed) > 1 else ""
