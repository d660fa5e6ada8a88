"""The servers the class matrix and the GPU soak compare: how each one starts, answers and stops.

mlxd and mlx_lm.server run from the Python they are given (mlxd from the checkout, mlx-lm from
its site); vllm-mlx, Rapid-MLX and mlx-vlm's server each from their own ``--target`` folder under
the peers root (bench/gpu/stage_peers.sh), put first on PYTHONPATH so vllm-mlx's and Rapid-MLX's
mlx-lm 0.31.3 shadows mlxd's 0.32.2. Each server gets its own HOME (vllm-mlx keeps a prefix cache
on disk there: a second run must not start warm) and runs in its own process group, so stopping
it stops its workers too.

Flags, from each peer's ``serve --help``: vllm-mlx serves with ``--continuous-batching`` (its
batched engine) and ``--enable-prefix-cache``; Rapid-MLX always batches and takes
``--enable-prefix-cache``; mlx-vlm's server batches up to ``--max-num-seqs``, caches prefixes
with ``APC_ENABLED=1`` in its environment and answers only /v1/chat/completions, the model named
by its path; mlx_lm.server batches up to
``--decode-concurrency`` with its LRU prompt cache on by default.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SERVERS = ("mlxd", "vllm-mlx", "rapid-mlx", "mlx-vlm", "mlx_lm.server")


@dataclass(frozen=True)
class Server:
    """One kind of server: its command line, where it says it is up, how requests name the model."""

    name: str
    health: str  # the path that answers 200 once the model is loaded
    endpoint: str = "completions"  # mlxd bench run --endpoint
    text_prompts: bool = True  # prompts as text (a peer takes no token ids)
    peer_dir: str | None = None  # its folder under the peers root
    dist: str = ""  # its distribution, for the version
    env: tuple[tuple[str, str], ...] = ()  # settings it reads from the environment
    vision_args: tuple[str, ...] = ()  # what it needs to serve a vision-language model

    def argv(self, model: str, port: int, max_seqs: int, extra: list[str]) -> list[str]:
        """The arguments after ``python``."""
        return [*_ARGV[self.name](model, str(port), str(max_seqs)), *extra]

    def model_name(self, model: str) -> str:
        """The ``model`` field of a request."""
        return model if self.name in ("mlx-vlm", "mlx_lm.server") else "bench"


_ARGV = {
    "mlxd": lambda m, p, n: [
        "-m",
        "mlxd",
        "start",
        "--model",
        f"bench={m}",
        "--port",
        p,
        "--max-num-seqs",
        n,
        "--max-queued",
        "1024",
        "--log-level",
        "info",  # its load and each warm-up stage timed in the server's log
    ],
    "vllm-mlx": lambda m, p, n: [
        "-c",
        _main("vllm_mlx.cli", "vllm-mlx"),
        "serve",
        m,
        "--port",
        p,
        "--served-model-name",
        "bench",
        "--continuous-batching",
        "--enable-prefix-cache",
        "--max-num-seqs",
        n,
    ],
    "rapid-mlx": lambda m, p, n: [
        "-c",
        _main("rapid_mlx.cli", "rapid-mlx"),
        "serve",
        m,
        "--port",
        p,
        "--served-model-name",
        "bench",
        "--max-num-seqs",
        n,
        "--enable-prefix-cache",
        "--disable-model-downloads",
        "--no-preflight",
    ],
    "mlx-vlm": lambda m, p, n: [
        "-m",
        "mlx_vlm.server",
        "--model",
        m,
        "--port",
        p,
        "--host",
        "127.0.0.1",
        "--max-num-seqs",
        n,
    ],
    "mlx_lm.server": lambda m, p, n: [
        "-m",
        "mlx_lm.server",
        "--model",
        m,
        "--port",
        p,
        "--decode-concurrency",
        n,
        "--log-level",
        "WARNING",
    ],
}


def _main(module: str, prog: str) -> str:
    """A console script's entry point as ``python -c`` code (a --target folder's bin/ is not
    on PATH)."""
    return f"import sys; sys.argv[0] = {prog!r}; from {module} import main; sys.exit(main())"


SPECS = {
    "mlxd": Server("mlxd", "/health", text_prompts=False, dist="mlxd"),
    # --mllm: their multimodal engine (MLLM batching), which they pick by the model's name
    # otherwise, and a made model's path names no family.
    "vllm-mlx": Server(
        "vllm-mlx", "/health", peer_dir="vllm-mlx", dist="vllm-mlx", vision_args=("--mllm",)
    ),
    "rapid-mlx": Server(
        "rapid-mlx", "/health", peer_dir="rapid-mlx", dist="rapid-mlx", vision_args=("--mllm",)
    ),
    # APC_ENABLED: mlx-vlm's prefix cache (automatic prefix caching) is off unless set.
    "mlx-vlm": Server(
        "mlx-vlm",
        "/health",
        "chat",
        peer_dir="mlx-vlm",
        dist="mlx-vlm",
        env=(("APC_ENABLED", "1"),),
    ),
    "mlx_lm.server": Server("mlx_lm.server", "/v1/models", dist="mlx-lm"),
}


@dataclass
class Running:
    """A started server: its process (group leader), port, log and scratch HOME."""

    spec: Server
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    env: dict[str, str] = field(repr=False)
    started: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None


def peer_env(
    spec: Server, python_path: str, peers_root: Path, home: Path, vision: bool = False
) -> dict[str, str]:
    """The environment a server runs in: its own folder first on PYTHONPATH, its own HOME.
    ``vision``: mlx-vlm's folder last, for those that load a VLM through mlx-vlm without
    their own copy (mlxd, vllm-mlx; Rapid-MLX has its pinned 0.7.2 in its folder)."""
    env = {**os.environ, "HOME": str(home), "MLXD_HOME": str(home / "mlxd")}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.update(spec.env)
    parts = [str(peers_root / spec.peer_dir)] if spec.peer_dir else []
    last = [str(peers_root / "mlx-vlm")] if vision and spec.peer_dir != "mlx-vlm" else []
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*parts, python_path, *last] if p)
    return env


def version(spec: Server, python: str, env: dict[str, str]) -> str:
    """The server's installed version, as its own Python sees it ('missing' if not installed);
    mlxd's is the checkout's commit ($MLXD_COMMIT where the machine's copy of .git is stale)."""
    if spec.name == "mlxd":
        return os.environ.get("MLXD_COMMIT") or _commit()
    code = f"import importlib.metadata as m; print(m.version({spec.dist!r}))"
    r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else "missing"


def _commit() -> str:
    here = Path(__file__).resolve().parent
    r = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True
    )
    return r.stdout.decode().strip() or "?"


def start(spec: Server, model: str, port: int, opts: StartOptions, log: Path) -> Running:
    """Launch ``spec`` on ``model`` in its own process group; returns at once."""
    home = Path(tempfile.mkdtemp(prefix=f"peer-{spec.name}-"))
    env = peer_env(spec, opts.python_path, opts.peers_root, home, opts.vision)
    extra = [*opts.extra.get(spec.name, []), *(spec.vision_args if opts.vision else ())]
    cmd = [opts.python, *spec.argv(model, port, opts.max_seqs, extra)]
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=home
        )
    return Running(spec, proc, port, log, env)


@dataclass(frozen=True)
class StartOptions:
    """What every server start shares."""

    python: str
    python_path: str
    peers_root: Path
    max_seqs: int = 128
    extra: dict[str, list[str]] = field(default_factory=dict)  # per server name
    vision: bool = False  # the model is a VLM: requests carry images


def wait_ready(server: Running, timeout_s: float) -> float | None:
    """Seconds from the start until the health path answers 200; None if it died or timed out."""
    deadline = server.started + timeout_s
    while time.monotonic() < deadline and server.alive():
        try:
            if httpx.get(server.url + server.spec.health, timeout=2).status_code == 200:
                return round(time.monotonic() - server.started, 2)
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return None


def stop(server: Running, grace_s: float = 20) -> int | None:
    """SIGTERM the server's group, SIGKILL what is left after ``grace_s``; its exit code."""
    _signal_group(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(server.proc.pid, signal.SIGKILL)  # workers that outlived their parent too
    server.proc.wait()
    return server.proc.returncode


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def log_tail(path: Path, lines: int = 15) -> str:
    """The end of a server's log, for a failure's record."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
