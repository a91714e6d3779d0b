"""A stream that outlives the checks made when it started checks again while it runs.

A subscription (or a long scan) is authorized once, at its DoGet; it may then run for hours.
:class:`StreamRecheck` repeats the checks (the caller's token still valid: not expired, its user
not removed, its password unchanged; the caller still granted what the stream needs) at most every
:data:`RECHECK_INTERVAL_S`, at every batch and at every idle poll of a subscription (heartbeats
included), and ends the stream with the check's error (UNAUTHENTICATED / PERMISSION_DENIED).
A revoked grant, a removed user or an expired token thus stops a stream within about that long
plus the subscription's poll interval (0.1 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["RECHECK_INTERVAL_S", "StreamRecheck"]

RECHECK_INTERVAL_S = 0.2
T = TypeVar("T")


class StreamRecheck:
    """The checks of one stream; each raises when the stream must end. Used by the one thread
    that pulls the stream."""

    def __init__(self, checks: Sequence[Callable[[], None]], interval_s: float = RECHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.checks = tuple(checks)
        self.interval_s = interval_s
        self.clock = clock
        self._next = clock() + interval_s  # the stream was authorized just now

    def check(self) -> None:
        """Run the checks if the last run is older than the interval (cheap otherwise)."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        for check in self.checks:
            check()

    def guard(self, batches: Iterator[T]) -> Iterator[T]:
        """``batches``, checked before each one is handed on."""
        try:
            for batch in batches:
                self.check()
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
