"""A set whose members are forgotten after a time to live or past a size cap (oldest first).

The server remembers cancelled query tickets so that a DoGet of one is refused; a client may
cancel without end, so the memory of cancellations must be bounded. Tickets are stateless and a
query is read soon after its FlightInfo, so forgetting a cancellation after
:data:`CANCELLED_TTL_S` (or when :data:`MAX_CANCELLED` newer ones arrived) only lets a client
that kept a cancelled ticket that long run it after all.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

__all__ = ["CANCELLED_TTL_S", "MAX_CANCELLED", "ExpiringSet"]

CANCELLED_TTL_S = 3600.0
MAX_CANCELLED = 100_000


class ExpiringSet:
    """Members live ``ttl_s`` seconds (``clock`` time) and at most ``max_size`` are kept.
    Thread-safe; every operation costs O(1) amortized (expired members leave from the front)."""

    def __init__(self, ttl_s: float = CANCELLED_TTL_S, max_size: int = MAX_CANCELLED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0 or max_size < 1:
            raise ValueError("ExpiringSet needs a positive ttl_s and max_size")
        self.ttl_s = ttl_s
        self.max_size = max_size
        self._clock = clock
        self._members: OrderedDict[Hashable, float] = OrderedDict()  # member -> expiry, oldest first
        self._lock = threading.Lock()

    def _prune(self, now: float) -> None:
        while self._members and (next(iter(self._members.values())) <= now
                                 or len(self._members) > self.max_size):
            self._members.popitem(last=False)

    def add(self, member: Hashable) -> None:
        self.update([member])

    def update(self, members: Iterable[Hashable]) -> None:
        now = self._clock()
        with self._lock:
            for member in members:
                self._members.pop(member, None)  # re-adding renews it (moves it to the back)
                self._members[member] = now + self.ttl_s
            self._prune(now)

    def __contains__(self, member: object) -> bool:
        now = self._clock()
        with self._lock:
            self._prune(now)
            return member in self._members

    def __len__(self) -> int:
        with self._lock:
            self._prune(self._clock())
            return len(self._members)
