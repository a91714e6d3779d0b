"""Reads of log ranges that must be held whole: an expired offset is an error, never a silent skip.

:meth:`LogTablet.read` clamps a start below :attr:`LogTablet.start_offset` (retention may have
deleted it), which suits readers that want "whatever is left". Readers that asked for a precise
offset (a subscription resuming at its committed position, a KV snapshot plus the changelog after
it, ``$changelog`` from an offset) use :func:`read_held` instead: it raises
:class:`~flightstore.errors.OffsetOutOfRange` naming the earliest offset still held, also when
retention deletes the range between the check and the read, or deletes a segment under a reader
in the middle of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from flightstore.errors import CorruptData, OffsetOutOfRange
from flightstore.log.tablet import LogBatch, LogTablet

__all__ = ["read_held", "require_held"]


def require_held(log: LogTablet, offset: int, where: str) -> None:
    """Raise :class:`OffsetOutOfRange` unless ``start_offset <= offset <= end_offset``."""
    start, end = log.start_offset, log.end_offset
    if offset < start:
        raise OffsetOutOfRange(f"{where}: log offset {offset} has expired (deleted by 'table.log.ttl' "
                               f"after a KV snapshot covered it); the earliest offset still held is "
                               f"{start}. Start from 'earliest', or read the table's snapshot "
                               "(startup.mode=full) and follow the changelog from there")
    if offset > end:
        raise OffsetOutOfRange(f"{where}: log offset {offset} is past the end of the log ({end})")


def read_held(log: LogTablet, from_offset: int, where: str, *, columns: Sequence[str] | None = None,
              to_offset: int | None = None, max_rows: int | None = None) -> Iterator[LogBatch]:
    """The records of ``[from_offset, to_offset)`` like :meth:`LogTablet.read` (no filter), but
    every offset of the range must be held: checked before reading and against the first record
    read (retention may run in between)."""
    require_held(log, from_offset, where)
    return _checked(log.read(from_offset, columns=columns, to_offset=to_offset, max_rows=max_rows),
                    log, from_offset, where)


def _checked(records: Iterator[LogBatch], log: LogTablet, from_offset: int,
             where: str) -> Iterator[LogBatch]:
    position = from_offset
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except CorruptData:
            if log.start_offset > position:  # its segment file was deleted under the reader
                raise OffsetOutOfRange(f"{where}: log offset {position} expired while being read; "
                                       f"the earliest offset still held is {log.start_offset}") from None
            raise
        if record.base_offset > position and log.start_offset > position:
            # (a gap the log still holds is a lost range `flightstore repair` declared: reads skip
            # those; an undeclared one is DataLoss from the read itself)
            raise OffsetOutOfRange(f"{where}: log offset {position} expired while being read; the "
                                   f"earliest offset still held is {log.start_offset}")
        position = record.next_offset
        yield record
