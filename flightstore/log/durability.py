"""Group commit: writers that append concurrently share one fsync.

An append writes its record under the tablet lock, then (outside every lock) waits until the log is
durable up to the record's end. The first waiter becomes the *leader*: it fsyncs the segment, which
makes durable everything written before the fsync started, then wakes the others. Writers that
appended while the leader was syncing wait for the next fsync, which the first of them leads. So with
n concurrent writers a log pays about two fsyncs per round instead of n, and no writer is
acknowledged before its record is on disk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["GroupCommit", "fsync_file"]


def fsync_file(fd: int) -> None:
    """``os.fsync`` (one name for every log fsync, so fault-injection tests can hold it)."""
    os.fsync(fd)


class GroupCommit:
    """The durable end of one log and the fsyncs that move it."""

    def __init__(self, durable_offset: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._durable = durable_offset
        self._leading = False
        self.syncs = 0  # fsyncs done (tests and metrics: fewer than appends under concurrency)

    @property
    def durable_offset(self) -> int:
        return self._durable

    def advance(self, offset: int) -> None:
        """Everything below ``offset`` became durable by other means (a sealed segment)."""
        with self._cond:
            if offset > self._durable:
                self._durable = offset
                self._cond.notify_all()

    def reset(self, offset: int) -> None:
        """The log was cut back to ``offset`` (and made durable there): later appends start over."""
        with self._cond:
            self._durable = offset
            self._cond.notify_all()

    def wait(self, offset: int, flush: Callable[[], int]) -> None:
        """Return once everything below ``offset`` is durable.

        ``flush()`` makes durable what has been written so far and returns the offset it covers; it
        runs without any lock held, in the one leading thread. If it fails, the leader raises and
        the followers elect another leader (which retries).
        """
        with self._cond:
            while self._durable < offset:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                self._cond.release()
                covered = None
                try:
                    covered = flush()
                finally:
                    self._cond.acquire()
                    self._leading = False
                    if covered is not None:
                        self.syncs += 1
                        self._durable = max(self._durable, covered)
                    self._cond.notify_all()
