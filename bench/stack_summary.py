"""Where a worker's engine steps spend their time, from py-spy's raw stacks (``py-spy record -f
raw``): each function's share of the samples taken inside ``Engine.step``, by itself (self) and
with what it calls (inclusive), for one or more recordings side by side (the served worker
against the engine in-process: ``bench/gpu/gpu_gap.sh`` with ``SPY=1``).

    python bench/stack_summary.py served.txt engine.txt [--top 25]

The runner's ``decode_step`` waiting for the device shows as its own self time; what is left
is the host's work per step (building the graph, sampling, detokenizing, sending).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

STEP = "step (mlxd/worker/engine.py"  # py-spy's frame of ``Engine.step``


def load(path: Path) -> list[tuple[list[str], int]]:
    """Each stack (outermost frame first) with its sample count."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            out.append((stack.split(";"), int(count)))
    return out


def short(frame: str) -> str:
    """``function@file`` from py-spy's ``function (path:line)``."""
    name, _, where = frame.partition(" (")  # a native frame's is its library: "(libc.so.6)"
    return f"{name}@{where.rstrip(')').rsplit('/', 1)[-1].split(':')[0]}"


def in_step(stacks: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
    """The stacks taken inside ``Engine.step``."""
    return [(s, n) for s, n in stacks if any(STEP in f for f in s)]


def shares(stacks: list[tuple[list[str], int]]) -> tuple[collections.Counter, collections.Counter]:
    """Samples by function: self, and inclusive (once per stack)."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    for stack, n in stacks:
        own[short(stack[-1])] += n
        for name in {short(f) for f in stack}:
            inclusive[name] += n
    return own, inclusive


def report(path: Path, top: int) -> str:
    stacks = load(path)
    steps = in_step(stacks)
    total = sum(n for _, n in steps) or 1
    own, inclusive = shares(steps)
    lines = [f"== {path.name}: {sum(n for _, n in stacks)} samples, {total} in Engine.step"]
    lines += [f"  self {v / total:6.1%}  {k}" for k, v in own.most_common(top)]
    inner = [(k, v) for k, v in inclusive.most_common() if v < total][:top]  # not step's callers
    lines += [f"  incl {v / total:6.1%}  {k}" for k, v in inner]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recordings", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    for path in args.recordings:
        print(report(path, args.top))


if __name__ == "__main__":
    main()
