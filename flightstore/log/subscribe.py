"""Follow a log as it grows: an endless iterator of newly appended records.

Subscriptions (``t$changelog`` streams, client ``subscribe``) sit on :func:`follow`: it reads what is
already there from ``from_offset``, then blocks on :meth:`LogTablet.wait_for` until more is appended,
yielding every record once, in offset order, until ``stop`` is set or the tablet closes.
"""

from __future__ import annotations

import threading
from typing import Iterator, Sequence

from flightstore.expressions import Predicate
from flightstore.log.tablet import LogBatch, LogTablet

__all__ = ["follow"]


def follow(tablet: LogTablet, from_offset: int, *, columns: Sequence[str] | None = None,
           filter: Predicate | None = None, stop: threading.Event | None = None,
           poll_timeout: float = 0.5, max_rows: int | None = None) -> Iterator[LogBatch]:
    """Yield the records of ``tablet`` from ``from_offset`` on, waiting for new appends.

    ``columns`` and ``filter`` are pushed down as in :meth:`LogTablet.read` (validated here, at call
    time). ``max_rows`` bounds the rows fetched per read, so a slow consumer does not pin a large
    backlog in memory. ``stop`` is checked at least every ``poll_timeout`` seconds; the iterator
    also ends when the tablet is closed. Offsets dropped by retention are skipped.
    """
    tablet.read(tablet.end_offset, columns=columns, filter=filter)  # validate eagerly
    return _follow(tablet, from_offset, columns, filter, stop, poll_timeout, max_rows)


def _follow(tablet: LogTablet, position: int, columns: Sequence[str] | None,
            filter: Predicate | None, stop: threading.Event | None, poll_timeout: float,
            max_rows: int | None) -> Iterator[LogBatch]:
    while not (stop is not None and stop.is_set()) and not tablet.closed:
        end = tablet.end_offset
        if position >= end:
            tablet.wait_for(position, poll_timeout)
            continue
        rows = 0
        last: LogBatch | None = None
        for batch in tablet.read(position, columns=columns, filter=filter, to_offset=end,
                                 max_rows=max_rows):
            yield batch
            rows += batch.batch.num_rows
            last = batch
        stopped_early = max_rows is not None and rows >= max_rows and last is not None
        position = last.next_offset if stopped_early else end
