"""A remote backend's circuit breaker and priority slots, on a clock the test moves."""

from __future__ import annotations

import asyncio

from mlxd.gateway.backends.remote.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from mlxd.gateway.backends.remote.slots import PrioritySlots


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_failures_in_a_row_and_probes_once() -> None:
    clock = Clock()
    b = Breaker(failures=3, cooldown_s=10, clock=clock)
    b.failed()
    b.failed()
    b.succeeded()  # a success breaks the run
    b.failed()
    b.failed()
    assert b.allow() and b.state == CLOSED
    b.failed()
    assert b.state == OPEN and not b.allow() and b.retry_in() == 10
    clock.now = 10
    assert b.current == HALF_OPEN
    assert b.allow() and not b.allow()  # one probe at a time
    b.failed()  # the probe failed: open again, for a whole cooldown
    assert b.state == OPEN and not b.allow()
    clock.now = 20
    assert b.allow()
    b.succeeded()
    assert b.state == CLOSED and b.allow() and b.allow()


def test_a_probe_that_ends_neither_way_lets_the_next_one_go() -> None:
    clock = Clock()
    b = Breaker(failures=1, cooldown_s=1, clock=clock)
    b.failed()
    clock.now = 1
    assert b.allow() and not b.allow()
    b.settled()  # the client left before the answer
    assert b.allow()


def test_slots_go_by_priority_then_arrival_with_aging() -> None:
    async def run() -> list[str]:
        clock = Clock()
        slots = PrioritySlots(1, aging_s=10, clock=clock)
        order: list[str] = []
        await slots.acquire()

        async def wait(name: str, priority: str, at: float) -> None:
            clock.now = at
            await slots.acquire(priority)
            order.append(name)

        tasks = [
            asyncio.create_task(wait(*a))
            for a in (
                ("low-old", "low", 0),
                ("normal", "normal", 15),
                ("high", "high", 15),
                ("low-new", "low", 15),
            )
        ]
        await asyncio.sleep(0)
        assert slots.waiting == 4
        clock.now = 16  # low-old: 2 - 1.6 = 0.4 beats normal's 1 - 0.1, not high's 0 - 0.1
        for _ in tasks:
            slots.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["high", "low-old", "normal", "low-new"]


def test_a_cancelled_waiter_gives_up_its_place() -> None:
    async def run() -> int:
        slots = PrioritySlots(1)
        await slots.acquire()
        waiter = asyncio.create_task(slots.acquire("high"))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        slots.release()
        return slots.free

    assert asyncio.run(run()) == 1
