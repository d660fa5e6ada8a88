"""A backend's ``max_concurrency`` slots, handed out by priority: the gateway's queue in front
of a remote API, ordered as a worker orders its own (``high`` before ``normal`` before
``low``, first come first served within a level, one level better per ``aging_s`` waited, so
``low`` requests are never starved)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxd.knobs import AGING_S, PRIORITIES


@dataclass(order=True)
class _Waiter:
    level: int
    seq: int
    since: float = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


class PrioritySlots:
    """``limit`` slots; ``acquire(priority)`` waits in priority order while all are taken."""

    def __init__(
        self,
        limit: int,
        aging_s: float = AGING_S.default,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = limit
        self.aging_s = aging_s
        self.clock = clock
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, priority: str = "normal") -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        waiter = _Waiter(
            PRIORITIES.index(priority),
            next(self._order),
            self.clock(),
            asyncio.get_running_loop().create_future(),
        )
        self._waiters.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.granted.done() and not waiter.granted.cancelled():
                self.release()  # granted as it was cancelled: pass the slot on
            raise

    def release(self) -> None:
        """Free a slot: the first waiter in priority order (with aging) takes it."""
        if not self._waiters:
            self.free += 1
            return
        now = self.clock()
        best = min(self._waiters, key=lambda w: (w.level - (now - w.since) / self.aging_s, w.seq))
        self._waiters.remove(best)
        best.granted.set_result(None)
