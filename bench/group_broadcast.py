"""Time one worker-group broadcast (worker/group.py's GroupChannel._broadcast: a length, then
the bytes, two all_sums) between two ring ranks on localhost: what a group adds per loop turn.

    python bench/group_broadcast.py [BYTES=60] [N=2000]     (starts both ranks itself)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
    size, n = (int(a) for a in (sys.argv[1:] + ["60", "2000"])[:2])
    if "MLX_RANK" not in os.environ:
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([["127.0.0.1:18931"], ["127.0.0.1:18932"]], f)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, str(size), str(n)],
                env=dict(os.environ, MLX_RANK=str(r), MLX_HOSTFILE=path),
            )
            for r in range(2)
        ]
        sys.exit(max(p.wait() for p in procs))
    import mlx.core as mx

    from mlxd.worker.group import GroupChannel, GroupClock

    group = mx.distributed.init(backend="ring", strict=True)
    channel = GroupChannel(group, None, GroupClock())
    payload = b"x" * size if group.rank() == 0 else b""
    for _ in range(50):
        channel._broadcast(payload)
    started = time.perf_counter()
    for _ in range(n):
        channel._broadcast(payload)
    if group.rank() == 0:
        print(f"broadcast of {size} B: {(time.perf_counter() - started) / n * 1e6:.0f} us")


if __name__ == "__main__":
    main()
