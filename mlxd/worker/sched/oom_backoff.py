"""Raising ``max_num_seqs`` again after the device ran out of memory.

On an out-of-memory error the engine halves the batch (``Engine._recover``). Such an error is
often passing: another process's buffer cache on a shared GPU, one long prompt's activations,
a burst of verification shapes. A batch left at a quarter of its size for the rest of the
worker's life costs most of its throughput (on an H100, a speculation benchmark whose two
daemons shared one GPU ran at 0.13x after such halvings), so after ``RECOVER_STEPS`` decode
steps in a row without running out the limit doubles, up to the one set before the first
failure. A failure soon after a raise doubles the wait (up to ``MAX_WAIT``), so a batch that
truly does not fit settles rather than failing every few hundred steps; ``MAX_WAIT`` clean
steps back at the limit forget that. A limit changed by
hand (``mlxd worker set``) is the user's and ends the backoff.
"""

from __future__ import annotations

RECOVER_STEPS = 256  # clean decode steps before the limit doubles
MAX_WAIT = 8192


class OomBackoff:
    """The engine's ``max_num_seqs`` after out-of-memory errors (see the module doc)."""

    def __init__(self) -> None:
        self.target: int | None = None  # the limit before the first failure; None: none yet
        self.limit = 0  # the limit this backoff set last
        self.wait = RECOVER_STEPS
        self.steps = 0
        self.raised = False  # the last change was a raise

    def on_oom(self, current: int, limit: int) -> None:
        """The engine lowered ``max_num_seqs`` from ``current`` to ``limit``."""
        if self.target is None or current != self.limit:  # a first failure, or one after a set
            self.target, self.wait = current, RECOVER_STEPS
        elif self.raised and self.steps < self.wait:  # the raise failed soon: wait longer
            self.wait = min(MAX_WAIT, 2 * self.wait)
        self.limit, self.steps, self.raised = limit, 0, False

    def on_step(self, current: int) -> int | None:
        """A decode step succeeded under ``current``: the raised limit when it is time, else
        None. Steps count at the target too, so a failure soon after the last raise waits
        longer, and a long clean run there forgets that."""
        if self.target is None:
            return None
        if current != self.limit:  # set by hand meanwhile
            self.target = None
            return None
        self.steps += 1
        if current >= self.target:
            if self.steps >= MAX_WAIT:
                self.wait = RECOVER_STEPS
            return None
        if self.steps < self.wait:
            return None
        self.limit, self.steps, self.raised = min(self.target, 2 * current), 0, True
        return self.limit
