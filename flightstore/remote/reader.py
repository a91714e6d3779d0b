"""Reading uploaded segments: a remote segment as the log's reader sees a local one.

:meth:`LogTablet.read <flightstore.log.tablet.LogTablet.read>` reads offsets below its local
segments from the list :meth:`RemoteBucket.segments_below
<flightstore.remote.bucket.RemoteBucket.segments_below>` gives it: one :class:`RemoteSegment` per
uploaded segment, which knows its offsets from the manifest and is downloaded (into the bounded
cache, checked against the manifest's checksums) only when the read reaches it. A read that stops
early downloads nothing more. The download stays pinned in the cache for as long as the read holds
the object (the reader's generator), and is released when the read ends or is dropped.

A remote segment that the manifest lists but storage does not hold, or whose bytes fail their
checksum, is :class:`~flightstore.errors.DataLoss` naming it: an answer is never short.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightstore.log.index import SegmentIndex
from flightstore.log.record import RecordHeader
from flightstore.log.segment import Segment

__all__ = ["RemoteSegment"]


class RemoteSegment:
    """One uploaded segment, opened from the cache on first use (``open_segment`` returns the
    segment and the function that releases it)."""

    def __init__(self, base_offset: int, next_offset: int,
                 open_segment: Callable[[], tuple[Segment, Callable[[], None]]]) -> None:
        self.base_offset = base_offset
        self.next_offset = next_offset
        self._open_segment = open_segment
        self._segment: Segment | None = None

    def _opened(self) -> Segment:
        if self._segment is None:
            segment, release = self._open_segment()
            weakref.finalize(self, release)
            self._segment = segment
        return self._segment

    def view(self) -> SegmentIndex:
        return self._opened().view()

    def header(self, number: int, index: SegmentIndex) -> RecordHeader:
        return self._opened().header(number, index)

    def read_batch(self, record: RecordHeader, included_fields: Any, schema: pa.Schema,
                   compressed: bool = False) -> tuple[pa.RecordBatch, int]:
        return self._opened().read_batch(record, included_fields, schema, compressed)

    def __repr__(self) -> str:
        return f"RemoteSegment([{self.base_offset}, {self.next_offset}))"
