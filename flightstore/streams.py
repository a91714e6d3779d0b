"""Reading a Flight DoGet stream batch by batch: the one loop the client, the cluster's forwarded
calls and the Spark connector share.

A stream is read one message at a time (never ``read_all``: a scan may not fit in memory) and is
cancelled when its reader goes away (the consumer stopped iterating early, the stream ended or
failed), so the server stops producing at once instead of filling gRPC's buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyarrow import flight

__all__ = ["BatchStream", "read_batches"]


def read_batches(reader: flight.FlightStreamReader, *, keep_empty: bool = False,
                 map_error: Callable[[Exception], BaseException] | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of a DoGet stream, one at a time. Empty batches are skipped unless ``keep_empty``
    (a subscription's heartbeats are empty batches). An error reading a message is raised as
    ``map_error(exc)`` when given (the cluster names the bucket and server it forwarded to)."""
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - mapped by the caller's hook, then raised
                if map_error is None:
                    raise
                raise map_error(exc) from None
            if chunk.data is not None and (keep_empty or chunk.data.num_rows):
                yield chunk.data
    finally:
        reader.cancel()


class BatchStream(Iterator[pa.RecordBatch]):
    """The record batches of one result, one at a time, with the result's ``schema`` known before
    the first batch (so an empty result still has its columns). Stopping early and dropping the
    stream (or :meth:`close`) cancels what is still being read."""

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> None:
        self.schema = schema
        self._batches = batches

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._batches)

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
