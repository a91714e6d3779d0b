"""The queries a server is streaming now, so that they can be stopped from outside their call.

Each DoGet of a query registers its :class:`~flightstore.sql.control.QueryControl` under the query
id its ticket carries (one id per FlightInfo). ``CancelFlightInfo`` cancels the controls of an id
(and remembers the id, bounded, for DoGets that start later); a shutdown past its grace period
cancels them all. The executor and the engine's watchdog then stop the work.

Each running stream also keeps who runs it, its SQL and when it started (:meth:`RunningQueries.running`),
under a number of its own, so an operator can list and stop one query (the console's cancel button,
:meth:`RunningQueries.cancel_stream`) without its FlightInfo.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from flightstore.sql.control import QueryControl

__all__ = ["MAX_CANCELLED_IDS", "RunningQueries", "RunningQuery"]

MAX_CANCELLED_IDS = 10_000
T = TypeVar("T")


@dataclass(frozen=True)
class RunningQuery:
    """One running query stream as an operator sees it: ``number`` names it in this server's
    process (:meth:`RunningQueries.cancel_stream`), ``user`` is None without authentication."""

    number: int
    query_id: str | None
    user: str | None
    sql: str | None
    started_ms: int


class RunningQueries:
    """Query id -> the controls of its running streams. Thread-safe."""

    def __init__(self) -> None:
        self._running: dict[int, tuple[str | None, QueryControl]] = {}
        self._described: dict[int, RunningQuery] = {}  # by the same key as _running
        self._numbers = itertools.count(1)
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # ids, oldest first
        self._shutting_down = False
        self._lock = threading.Lock()

    def count(self) -> int:
        """How many query streams are running."""
        with self._lock:
            return len(self._running)

    def stream(self, query_id: str | None, control: QueryControl, batches: Iterator[T], *,
               user: str | None = None, sql: str | None = None) -> Iterator[T]:
        """``batches``, registered as running under ``query_id`` (run by ``user``, for ``sql``)
        from the first batch asked for until the stream ends, fails or is closed."""
        key = id(control)
        with self._lock:
            self._running[key] = (query_id, control)
            self._described[key] = RunningQuery(next(self._numbers), query_id, user, sql, int(time.time() * 1000))
            if self._shutting_down:
                control.cancel("shutdown")
            elif query_id is not None and query_id in self._cancelled:
                control.cancel("cancelled")
        try:
            yield from batches
        finally:
            control.detach()  # the call's context ends with the stream
            with self._lock:
                self._running.pop(key, None)
                self._described.pop(key, None)

    def running(self) -> list[RunningQuery]:
        """The running query streams, oldest first."""
        with self._lock:
            return sorted(self._described.values(), key=lambda q: q.number)

    def cancel_stream(self, number: int) -> RunningQuery | None:
        """Stop the running stream ``number`` (:meth:`running`); the stream stopped, or None when
        none runs under that number (it ended, or never was)."""
        with self._lock:
            key = next((k for k, q in self._described.items() if q.number == number), None)
            if key is None:
                return None
            described, control = self._described[key], self._running[key][1]
        control.cancel("cancelled")
        return described

    def cancel(self, query_ids: set[str]) -> int:
        """Stop the running streams of ``query_ids`` and refuse their later ones; return how many
        were running."""
        with self._lock:
            for query_id in query_ids:
                self._cancelled[query_id] = None
                self._cancelled.move_to_end(query_id)
            while len(self._cancelled) > MAX_CANCELLED_IDS:
                self._cancelled.popitem(last=False)
            hit = [control for query_id, control in self._running.values() if query_id in query_ids]
        for control in hit:
            control.cancel("cancelled")
        return len(hit)

    def cancel_all(self, reason: str = "shutdown") -> int:
        """Stop every running stream (and any that starts later); return how many were running."""
        with self._lock:
            self._shutting_down = True
            controls = [control for _, control in self._running.values()]
        for control in controls:
            control.cancel(reason)
        return len(controls)
