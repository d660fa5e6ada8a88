"""A worker's memory at start, under N streams and some time after (issue 21 point 1).

Starts `mlxd start` (the built-in model unless --model), reads the worker's RSS (``ps``) and its
status (MLX active memory, KV used / reserved / budget) at start, every half second while
``--streams`` long completions run together (the most seen), and ``--after`` seconds after they
end. Prints one table and, with --json, writes the samples.

    .venv/bin/python bench/kv_memory.py [--model NAME=PATH] [--streams 16] [--after 60]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from mlxd.config import data_dir
from mlxd.daemon import admin_socket

FIELDS = ("rss", "active_bytes", "kv_bytes", "kv_reserved_bytes", "kv_budget_bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="NAME=PATH (default: the built-in model)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--after", type=float, default=60.0, help="seconds after the streams end")
    ap.add_argument("--json", help="write the samples here")
    ap.add_argument("start_args", nargs="*", help="more `mlxd start` options (after --)")
    args = ap.parse_args()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *(["--model", args.model] if args.model else []),
        *args.start_args,
    ]
    daemon = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        name = wait(url)
        rows = {"start": _sample(url, name)}
        if args.streams:
            rows["under load"] = _under_load(url, name, args)
            time.sleep(args.after)
            rows[f"{args.after:g} s after"] = _sample(url, name)
    finally:
        daemon.terminate()
        daemon.wait(60)
    _print(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


def wait(url: str) -> str:
    """The served model's name, once the daemon at ``url`` is healthy."""
    for _ in range(1200):
        try:
            models = httpx.get(f"{url}/v1/models", timeout=2).json()["data"]
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return str(models[0]["id"])
        except (httpx.HTTPError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    raise SystemExit("the daemon did not start")


def admin(url: str) -> httpx.Client:
    """A client of the daemon's admin Unix socket, as this host's mlxd CLI reaches it."""
    uds = admin_socket.find(data_dir(), url)
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(uds)), base_url="http://mlxd", timeout=60
    )


def _sample(url: str, name: str) -> dict[str, int]:
    with admin(url) as client:
        status = client.get(f"/admin/models/{name}/status").json()
    rss = subprocess.run(
        ["ps", "-o", "rss=", "-p", str(status["pid"])], capture_output=True, text=True, check=True
    ).stdout
    return {"rss": int(rss.strip()) * 1024, **{k: status["memory"].get(k, 0) for k in FIELDS[1:]}}


def _under_load(url: str, name: str, args: argparse.Namespace) -> dict[str, int]:
    """The most of each field seen while the streams run."""
    most: dict[str, int] = dict.fromkeys(FIELDS, 0)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                sample = _sample(url, name)
            except (httpx.HTTPError, KeyError):  # status waits for the engine: a long step
                continue
            for k, v in sample.items():
                most[k] = max(most[k], v)
            time.sleep(0.5)

    def stream(i: int) -> None:
        prompt = [100 + (i * 37 + 11 * j) % 5000 for j in range(args.prompt_tokens)]
        body = {
            "model": name,
            "prompt": prompt,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=3600)
        r.raise_for_status()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(args.streams) as pool:
            list(pool.map(stream, range(args.streams)))
    finally:
        done.set()
        watcher.join()
    return most


def _print(rows: dict[str, dict[str, int]], args: argparse.Namespace) -> None:
    print(
        f"model {args.model or 'built-in'}, {args.streams} streams of {args.prompt_tokens} + "
        f"{args.max_tokens} tokens; MiB"
    )
    print(f"{'':14}" + "".join(f"{f:>20}" for f in FIELDS))
    for label, row in rows.items():
        print(f"{label:14}" + "".join(f"{row[f] / 2**20:>20.1f}" for f in FIELDS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
