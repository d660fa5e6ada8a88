"""A worker group: one model served by several processes over ``mlx.core.distributed``.

Rank 0 is the worker the gateway sees: it binds the data and control sockets and answers
everything, exactly like a lone worker. The other ranks run the same engine on their shard of
the model (tensor parallel: mlx-lm's ``model.shard(group)``, whose sharded layers ``all_sum``
inside every forward) and follow rank 0's steps: at the top of every loop iteration rank 0
broadcasts what it received (data messages, control commands, a stop), its clock and nothing
else; every rank then dispatches the same messages in the same order, so each scheduler, paged
pool and prefix cache makes the same decisions and every forward meets its collectives. What
could differ is pinned: requests without a seed get one from rank 0 (the same on every rank),
the clock the schedulers and the speculation controller read is rank 0's at the top of the
iteration, and idle KV release is off. Only rank 0 sends; the others' sends go nowhere.

Ranks find each other by MLX's launch conventions (``MLX_RANK`` and ``MLX_HOSTFILE`` for the
ring backend; ``MLX_WORLD_SIZE``, ``NCCL_HOST_IP``/``NCCL_PORT`` for NCCL;
``MLX_JACCL_COORDINATOR`` and ``MLX_IBV_DEVICES`` for JACCL). ``mlxd start --group-size N``
starts rank 0, which starts ranks 1..N-1 on its own host with a hostfile of free localhost
ports; across hosts, ``mlx.launch`` starts ``mlxd worker serve`` on each and the daemon attaches
rank 0 with ``--worker`` (docs/ARCHITECTURE.md, "A group across two Macs"). The broadcast is an
``all_gather`` of rank 0's length and every rank's digest of its engine state (a rank that
diverged stops the group, rather than hang it), then an ``all_sum`` of the bytes to which only
rank 0 contributes (msgpack, uint8).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import msgpack

from mlxd import gpus
from mlxd.config import WorkerConfig
from mlxd.errors import ConfigError, ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.channel import WorkerChannel
from mlxd.protocol.messages import Generate, Message

log = logging.getLogger("mlxd.worker")

LEADER_ENV = "MLXD_GROUP_LEADER"  # a follower's rank 0 pid: it exits when that process is gone
_Incoming = tuple[bytes, Message | ProtocolError]


def join(config: WorkerConfig) -> Any | None:
    """This process's group (``mx.distributed.Group``), or None for a lone worker.

    With ``config.group_size`` > 1 and no launcher's environment, this process is rank 0: it
    writes a localhost hostfile and starts the other ranks first (``init`` waits for all)."""
    if config.group_size > 1 and not _launched():
        _start_followers(config)
    if not _launched():
        return None
    import mlx.core as mx

    backend = config.distributed if config.group_size > 1 else _env_backend()
    group = mx.distributed.init(backend=backend, strict=True)
    log.info("rank %d of %d (%s)", group.rank(), group.size(), backend)
    return group if group.size() > 1 else None


def shard(model: Any, group: Any) -> None:
    """Tensor parallel: each rank keeps 1/N of every attention and MLP projection."""
    if not hasattr(model, "shard"):
        arch = type(model).__module__.rsplit(".", 1)[-1]
        raise ConfigError(
            f"{arch} cannot be split over a worker group: its mlx-lm model "
            "has no shard() (tensor parallel); pipeline parallel is not "
            "supported"
        )
    try:
        model.shard(group)
    except (ValueError, AssertionError) as exc:
        raise ConfigError(f"cannot shard the model over {group.size()} ranks: {exc}") from None


def check_same(group: Any, values: list[int], what: str) -> None:
    """Refuse to start unless every rank computed the same ``values`` (pool size, context)."""
    import mlx.core as mx

    mine = mx.array(values, dtype=mx.int64)
    every = mx.distributed.all_gather(mine[None], group=group)  # on the backend's own stream
    if not bool(mx.all(every == mine[None]).item()):
        raise ConfigError(
            f"the group's ranks disagree on {what}: {every.tolist()} (set "
            "--kv-cache-gb and --max-context)"
        )


class GroupClock:
    """Rank 0's clock as of the last broadcast: what every rank's scheduler reads."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class GroupChannel:
    """The engine's channel in a group: rank 0 wraps its bound ``WorkerChannel`` and
    broadcasts what it receives; other ranks receive that broadcast and send nothing.

    Args:
        group: the ``mx.distributed`` group.
        inner: rank 0's bound channel (None on the other ranks).
        clock: set from each broadcast.
    """

    def __init__(self, group: Any, inner: WorkerChannel | None, clock: GroupClock) -> None:
        import zmq

        self.group = group
        self.inner = inner
        self.clock = clock
        self.context = inner.context if inner is not None else zmq.Context.instance()
        self.stop_requested = False  # rank 0: a signal asked to stop; told to every rank
        self.on_stop: Any = None  # set by ``attach``: ends the engine loop
        self.engine: Any = None  # set by ``attach``: its state is checked at every broadcast
        self._control: list[_Incoming] = []
        self._bad_control: list[_Incoming] = []

    def recv_ready(self, timeout_ms: int, limit: int = 1024) -> list[_Incoming]:
        bad: list[_Incoming] = []  # frames rank 0 could not decode: answered there alone
        payload = b""
        if self.inner is not None:
            data = [_seeded(i) for i in self.inner.recv_ready(timeout_ms, limit)]
            ctl = self.inner.recv_control()
            bad = [i for i in data if isinstance(i[1], ProtocolError)]
            self._bad_control = [i for i in ctl if isinstance(i[1], ProtocolError)]
            payload = _pack(time.monotonic(), data, ctl, self.stop_requested)
        now, data, control, stop = _unpack(self._broadcast(payload))
        self._control = control + self._bad_control
        self._bad_control = []
        self.clock.now = now
        if stop and self.on_stop is not None:
            self.on_stop()
        return data + bad

    def digest(self) -> int:
        """What every rank's engine must agree on between steps: rows, queue, free blocks."""
        engine = self.engine
        if engine is None:
            return 0
        pool = engine.scheduler.pool
        state = (
            len(engine.runner.rows),
            len(engine.scheduler.waiting),
            len(engine.scheduler.running),
            0 if pool is None else pool.num_free,
        )
        return hash(state) & 0x7FFFFFFFFFFF

    def recv_control(self, limit: int = 64) -> list[_Incoming]:
        control, self._control = self._control, []
        return control

    def send(self, client: bytes, msg: Message) -> None:
        if self.inner is not None:
            self.inner.send(client, msg)

    def send_control(self, client: bytes, msg: Message) -> None:
        if self.inner is not None:
            self.inner.send_control(client, msg)

    def bind_control(self, endpoint: str, answer: Any = None) -> None:
        if self.inner is not None:
            self.inner.bind_control(endpoint, answer=answer)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def _broadcast(self, payload: bytes) -> bytes:
        import mlx.core as mx
        import numpy as np

        # One all_gather carries rank 0's length and every rank's digest of its engine state:
        # ranks that stopped deciding alike would hang in the next forward, so they stop here.
        mine = mx.array([len(payload), self.digest()], dtype=mx.int64)
        # No stream named: each backend's own (ring: the CPU; NCCL: the GPU, which a CPU
        # stream would not reach).
        every = mx.distributed.all_gather(mine[None], group=self.group).tolist()
        if len({d for _, d in every}) > 1:
            log.error("the group's ranks diverged (engine digests %s); exiting", every)
            os._exit(1)
        n = every[0][0]
        if n == 0:
            return b""
        buf = np.frombuffer(payload, dtype=np.uint8) if payload else np.zeros(n, np.uint8)
        out = mx.distributed.all_sum(mx.array(buf), group=self.group)
        return bytes(np.array(out, copy=False))


def attach(engine: Any, channel: GroupChannel, leader: bool) -> None:
    """Wire the engine to the group: stop together, no idle release, signals go through rank 0
    (a follower ignores SIGINT/SIGTERM: rank 0 tells it to stop; it exits if rank 0 is gone)."""
    from mlxd.worker.idle_release import IdleRelease

    def stop() -> None:
        engine.should_exit = True

    channel.on_stop = stop
    channel.engine = engine
    engine.idle_release = IdleRelease(0)  # shrinking the pool on one rank's timer would diverge
    speculator = getattr(engine, "speculator", None)
    if speculator is not None:  # it times steps to choose whether to verify drafts: rank 0's
        speculator.clock = channel.clock  # clock, so every rank chooses alike

    def request_stop(signum: int, frame: object) -> None:
        channel.stop_requested = True

    handler = request_stop if leader else signal.SIG_IGN
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    leader_pid = os.environ.get(LEADER_ENV)
    if not leader and leader_pid:
        _watch(lambda: os.getppid() != int(leader_pid), "rank 0 is gone")


# Internal helpers


def _launched() -> bool:
    """Whether ``mlx.launch`` (or ``--group-size``'s rank 0) set this process's group up."""
    return _env_backend() != ""


def _env_backend() -> str:
    """The backend whose launch environment this process has ("": none)."""
    env = os.environ
    if "MLX_HOSTFILE" in env:
        return "ring"
    if "MLX_JACCL_COORDINATOR" in env:  # RDMA over Thunderbolt 5 (`mlx.launch --backend jaccl`)
        return "jaccl"
    return "nccl" if "MLX_WORLD_SIZE" in env and "NCCL_HOST_IP" in env else ""


def _start_followers(config: WorkerConfig) -> None:
    """Rank 0 on one host: a hostfile of free localhost ports, ranks 1..N-1 started with it."""
    n = config.group_size
    env = dict(os.environ, **{LEADER_ENV: str(os.getpid())})
    if config.distributed == "ring":
        fd, path = tempfile.mkstemp(prefix="mlxd-group-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([[f"127.0.0.1:{_free_port()}"] for _ in range(n)], f)
        env["MLX_HOSTFILE"] = path
    else:  # nccl (each rank's GPU: mlxd.gpus)
        env.update(MLX_WORLD_SIZE=str(n), NCCL_HOST_IP="127.0.0.1", NCCL_PORT=str(_free_port()))
    follower = dataclasses.replace(config, parent_pid=None, reason_file=None)
    cmd = [sys.executable, "-m", "mlxd", "worker", "serve", "--config-json", follower.to_json()]
    visible = gpus.visible()
    procs = [
        subprocess.Popen(
            cmd,
            env=dict(env, MLX_RANK=str(r), **gpus.for_rank(r, visible)),
            stdin=subprocess.DEVNULL,
        )
        for r in range(1, n)
    ]
    os.environ.update({k: v for k, v in env.items() if k != LEADER_ENV}, MLX_RANK="0")
    log.info("started ranks 1..%d (pids %s)", n - 1, [p.pid for p in procs])
    _watch(lambda: any(p.poll() is not None for p in procs), "a rank of the group exited")
    import atexit

    atexit.register(lambda: [p.kill() for p in procs if p.poll() is None])


def _watch(gone: Any, why: str) -> None:
    """Exit at once when ``gone()``: a collective would wait for the missing rank forever."""

    def watch() -> None:
        while not gone():
            time.sleep(0.5)
        log.error("%s; exiting", why)
        os._exit(1)

    threading.Thread(target=watch, name="group-watch", daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seeded(item: _Incoming) -> _Incoming:
    """A Generate without a seed gets one here, so every rank samples the same tokens."""
    client, msg = item
    if isinstance(msg, Generate) and msg.sampling.seed is None:
        sampling = dataclasses.replace(msg.sampling, seed=random.getrandbits(63))
        return client, dataclasses.replace(msg, sampling=sampling)
    return item


def _pack(now: float, data: list[_Incoming], ctl: list[_Incoming], stop: bool) -> bytes:
    def frames(items: list[_Incoming]) -> list[list[bytes]]:
        # A frame set rank 0 could not decode is answered there; the others never see it.
        return [[c, *codec.encode(m)] for c, m in items if not isinstance(m, ProtocolError)]

    packed: bytes = msgpack.packb([now, frames(data), frames(ctl), stop])
    return packed


def _unpack(payload: bytes) -> tuple[float, list[_Incoming], list[_Incoming], bool]:
    now, data, ctl, stop = msgpack.unpackb(payload)

    def messages(items: list[list[bytes]]) -> list[_Incoming]:
        return [(f[0], codec.decode(f[1:])) for f in items]

    return now, messages(data), messages(ctl), stop
