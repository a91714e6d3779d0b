"""The queries a server is streaming now, so that they can be stopped from outside their call.

Each DoGet of a query registers its :class:`~flightstore.sql.control.QueryControl` under the query
id its ticket carries (one id per FlightInfo). ``CancelFlightInfo`` cancels the controls of an id
(and remembers the id, bounded, for DoGets that start later); a shutdown past its grace period
cancels them all. The executor and the engine's watchdog then stop the work.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TypeVar

from flightstore.sql.control import QueryControl

__all__ = ["MAX_CANCELLED_IDS", "RunningQueries"]

MAX_CANCELLED_IDS = 10_000
T = TypeVar("T")


class RunningQueries:
    """Query id -> the controls of its running streams. Thread-safe."""

    def __init__(self) -> None:
        self._running: dict[int, tuple[str | None, QueryControl]] = {}
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # ids, oldest first
        self._shutting_down = False
        self._lock = threading.Lock()

    def count(self) -> int:
        """How many query streams are running."""
        with self._lock:
            return len(self._running)

    def stream(self, query_id: str | None, control: QueryControl, batches: Iterator[T]) -> Iterator[T]:
        """``batches``, registered as running under ``query_id`` from the first batch asked for
        until the stream ends, fails or is closed."""
        key = id(control)
        with self._lock:
            self._running[key] = (query_id, control)
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
