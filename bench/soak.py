#!/usr/bin/env python
"""Soak test (not in CI): hours-scale mixed traffic against a real `mlxd start`, with random
client cancels and a worker SIGKILL every few minutes.

Records requests served, errors by kind, worker restarts, and gateway/worker memory over time
to OUT/soak.json, and plots memory and throughput to OUT/soak.png when matplotlib is installed.

    .venv/bin/python bench/soak.py --minutes 30 --out soak-out
    .venv/bin/python bench/soak.py --minutes 3 --kill-every 60 --model ~/models/qwen  # quick

Without --model it makes a tiny random model (as the tests do). Two workers serve the same
model as ``a`` and ``b``; kills alternate between them, so one model always keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

MODELS = ("a", "b")
PROMPTS = ["hello", "The quick brown fox", "Write a haiku about rivers.", "import os\n", "1 2 3"]


def main() -> int:
    args = _parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or _make_tiny_model()
    port = free_port()
    log = (args.out / "daemon.log").open("wb")
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-context",
        "1024",
        "--heartbeat-timeout",
        "5",
    ]
    for name in MODELS:
        cmd += ["--model", f"{name}={model}"]
    daemon = subprocess.Popen(cmd, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, daemon)
        report = asyncio.run(Soak(args, base, daemon.pid).run())
    finally:
        workers = _children(daemon.pid)
        daemon.send_signal(signal.SIGTERM)
        exit_code = daemon.wait(timeout=60)
        time.sleep(0.5)
    report["daemon_exit_code"] = exit_code
    report["left_running"] = [p for p in workers if Path(f"/proc/{p}").exists()]
    (args.out / "soak.json").write_text(json.dumps(report, indent=1))
    _plot(report, args.out / "soak.png")
    _print_summary(report)
    return 0 if exit_code == 0 and not report["left_running"] else 1


class Soak:
    """The traffic, the killer and the sampler, sharing one event loop."""

    def __init__(self, args: argparse.Namespace, base: str, daemon_pid: int) -> None:
        self.args = args
        self.base = base
        self.daemon_pid = daemon_pid
        self.outcomes: Counter[str] = Counter()
        self.kills: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.deadline = self.started + args.minutes * 60
        self.rng = random.Random(args.seed)

    async def run(self) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=self.args.clients + 8)
        async with httpx.AsyncClient(base_url=self.base, timeout=120, limits=limits) as http:
            self.http = http
            tasks = [self._client(i) for i in range(self.args.clients)]
            await asyncio.gather(*tasks, self._killer(), self._sampler())
        return {
            "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "minutes": self.args.minutes,
            "clients": self.args.clients,
            "requests": sum(self.outcomes.values()),
            "outcomes": dict(self.outcomes.most_common()),
            "kills": self.kills,
            "restarts": self.samples[-1]["restarts"] if self.samples else {},
            "samples": self.samples,
        }

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    async def _client(self, index: int) -> None:
        while time.monotonic() < self.deadline:
            outcome = await self._one_request()
            self.outcomes[outcome] += 1
            if outcome.startswith(("429", "503")):
                await asyncio.sleep(0.2)  # as a polite client would after Retry-After

    async def _one_request(self) -> str:
        rng = self.rng
        chat = rng.random() < 0.5
        body: dict[str, Any] = {
            "model": rng.choice(MODELS),
            "max_tokens": rng.randint(1, 64),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
        }
        prompt = rng.choice(PROMPTS)
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            if rng.random() < 0.6:
                return await self._stream(path, {**body, "stream": True}, rng.random() < 0.25)
            r = await self.http.post(path, json=body)
            return "ok" if r.status_code == 200 else _error_kind(r)
        except httpx.HTTPError as exc:
            return f"transport: {type(exc).__name__}"

    async def _stream(self, path: str, body: dict[str, Any], cancel: bool) -> str:
        cancel_after = self.rng.randint(1, 8)
        async with self.http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return _error_kind(r)
            chunks = 0
            async for line in r.aiter_lines():
                if line.startswith('data: {"error"'):
                    return "stream error: " + json.loads(line[6:])["error"].get("code", "?")
                if line == "data: [DONE]":
                    return "ok (stream)"
                chunks += line.startswith("data: ")
                if cancel and chunks >= cancel_after:
                    return "cancelled by client"
        return "stream ended without [DONE]"

    async def _killer(self) -> None:
        turn = 0
        while True:
            await asyncio.sleep(self.args.kill_every)
            if time.monotonic() + 5 > self.deadline:
                return
            name = MODELS[turn % len(MODELS)]
            turn += 1
            info = await self._admin_models()
            pid = info.get(name, {}).get("pid")
            if pid:
                os.kill(pid, signal.SIGKILL)
                self.kills.append({"t": self._now(), "model": name, "pid": pid})
                print(f"[{self._now():7.1f}s] killed worker {name} (pid {pid})", flush=True)

    async def _sampler(self) -> None:
        while True:
            info = await self._admin_models()
            sample = {
                "t": self._now(),
                "requests": sum(self.outcomes.values()),
                "gateway_rss_mb": _rss_mb(self.daemon_pid),
                "gateway_fds": len(os.listdir(f"/proc/{self.daemon_pid}/fd")),
                "worker_rss_mb": {n: _rss_mb(m["pid"]) for n, m in info.items() if m.get("pid")},
                "restarts": {n: m.get("restarts", 0) for n, m in info.items()},
            }
            self.samples.append(sample)
            if time.monotonic() >= self.deadline:
                return
            await asyncio.sleep(self.args.sample_every)

    async def _admin_models(self) -> dict[str, dict[str, Any]]:
        try:
            r = await self.http.get("/admin/status", timeout=10)
            return {m["name"]: m for m in r.json()["models"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return {}


def _error_kind(r: httpx.Response) -> str:
    try:
        code = r.json()["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = "no error body"
    return f"{r.status_code} {code}"


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def _plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (the JSON has every sample)")
        return
    samples = report["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, (mem, reqs) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    mem.plot(t, [s["gateway_rss_mb"] for s in samples], label="gateway")
    for name in MODELS:
        mem.plot(t, [s["worker_rss_mb"].get(name) for s in samples], label=f"worker {name}")
    for kill in report["kills"]:
        mem.axvline(kill["t"] / 60, color="red", alpha=0.3)
    mem.set_ylabel("RSS (MiB)")
    mem.legend()
    reqs.plot(t, [s["requests"] for s in samples])
    reqs.set_ylabel("requests done")
    reqs.set_xlabel("minutes (red lines: worker kills)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def _print_summary(report: dict[str, Any]) -> None:
    keys = ("requests", "outcomes", "kills", "restarts", "daemon_exit_code", "left_running")
    print(json.dumps({k: report[k] for k in keys}, indent=1))


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--model", default=None, help="model directory (default: a tiny random one)")
    p.add_argument("--clients", type=int, default=16, help="concurrent client loops")
    p.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("soak-out"))
    return p.parse_args()


def _make_tiny_model() -> str:
    from mlxd.models.maker import make_model

    out = Path(tempfile.mkdtemp(prefix="mlxd-soak-")) / "tiny-qwen3"
    return str(make_model(out, arch="qwen3", size="tiny", progress=lambda line: None))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    base: str,
    daemon: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 180,
    name: str = "mlxd start",
) -> None:
    """Until ``base``/health answers 200; exits if ``daemon`` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon is not None and daemon.poll() is not None:
            raise SystemExit(f"{name} exited with {daemon.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{name} did not become healthy")


if __name__ == "__main__":
    sys.exit(main())
