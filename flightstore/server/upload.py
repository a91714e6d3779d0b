"""Streaming uploads: DoPut bodies read message by message and applied in bounded chunks.

A DoPut (Flight SQL bulk ingest, a prepared statement's parameter rows, the Python client's
writes) is never read whole: :func:`upload_chunks` gathers the client's messages as they arrive
until ``write.chunk-rows`` rows or ``write.chunk-bytes`` bytes, and the caller applies each chunk
as one write before reading on. The server holds about one chunk (plus the message being
received) whatever the size of the upload, and no lock is held between chunks, so other clients'
reads and writes of the table go on while a large upload streams in.

What an upload that fails part-way leaves (a client that disconnects or cancels, a refused
message, a bad value): the chunks applied before the failure stay (each was one atomic write and
was counted in the table), the messages of the unfinished chunk are dropped, and a message is
never split between two chunks, so a batch the client sent is written whole or not at all. gRPC
ends the stream of a client that went away as if it had finished: the end of the stream counts
only when the call is not cancelled, else the unfinished chunk is dropped (Cancelled). An upload that is
one chunk or less (by default up to 256Ki rows / 16 MiB) is therefore all or nothing. A bulk ingest
that created its table drops it again on failure, leaving nothing.

A message whose decoded buffers exceed ``write.max-message-bytes`` is refused with
INVALID_ARGUMENT before anything of it is written (pyarrow's Flight server does not let us set
gRPC's own receive limit, so the check is on the decoded batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightstore.config import server_option
from flightstore.errors import Cancelled, InvalidInput

__all__ = ["UploadLimits", "read_forwarded", "upload_chunks"]


@dataclass(frozen=True)
class UploadLimits:
    """How a DoPut body is cut: rows and bytes per applied chunk, bytes per message."""

    chunk_rows: int
    chunk_bytes: int
    max_message_bytes: int

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> UploadLimits:
        return cls(server_option(options, "write.chunk-rows"), server_option(options, "write.chunk-bytes"),
                   server_option(options, "write.max-message-bytes"))


def upload_chunks(reader: Any, limits: UploadLimits,
                  cancelled: Callable[[], bool] | None = None) -> Iterator[pa.Table]:
    """The tables of ``reader``'s messages, gathered into chunks of about ``limits`` (a chunk
    closes at the first message that reaches either bound; messages are never split).

    ``reader`` is a Flight ``MetadataRecordBatchReader`` (anything with ``read_chunk`` and
    ``schema``). Empty messages are skipped; an upload without rows yields nothing. Raises
    InvalidInput for a message above ``limits.max_message_bytes``, and Cancelled when the stream
    ends because the call was cancelled (``cancelled()``: the call context's ``is_cancelled``)
    rather than finished by the client.
    """
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        batch = chunk.data
        if batch is None:  # app_metadata only
            continue
        nbytes = batch.get_total_buffer_size()
        if nbytes > limits.max_message_bytes:
            raise InvalidInput(
                f"a Flight message of {nbytes} bytes ({batch.num_rows} rows) exceeds the server's "
                f"write.max-message-bytes ({limits.max_message_bytes}); send smaller record batches")
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        size += nbytes
        if rows >= limits.chunk_rows or size >= limits.chunk_bytes:
            yield pa.Table.from_batches(pending, reader.schema)
            pending, rows, size = [], 0, 0
    if cancelled is not None and cancelled():
        raise Cancelled(f"the upload was cancelled (the client went away) before it finished; the "
                        f"{rows} row(s) of its unfinished chunk were not written")
    if pending:
        yield pa.Table.from_batches(pending, reader.schema)


def read_forwarded(reader: Any, limits: UploadLimits) -> pa.Table:
    """The rows of a write another server of the cluster forwarded: one part of one chunk, which
    the receiver must apply as one atomic write, so it is held whole, but bounded. A part is at
    most what the sender's chunk held (a client's chunk: its bounds plus the message that closed
    it; a statement's rows are cut to a chunk by the sender), so a part whose messages hold more
    than twice ``chunk_bytes + max_message_bytes`` (room for re-encoding) is refused
    (INVALID_ARGUMENT) as soon as they reach that, before anything is applied; every message is
    checked against ``limits.max_message_bytes`` like a client's."""
    bound = 2 * (limits.chunk_bytes + limits.max_message_bytes)
    pending: list[pa.RecordBatch] = []
    size = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        batch = chunk.data
        if batch is None or batch.num_rows == 0:
            continue
        nbytes = batch.get_total_buffer_size()
        if nbytes > limits.max_message_bytes:
            raise InvalidInput(f"a forwarded Flight message of {nbytes} bytes exceeds write.max-message-bytes "
                               f"({limits.max_message_bytes})")
        pending.append(batch)
        size += nbytes
        if size > bound:
            raise InvalidInput(f"a forwarded write holds more than a write chunk (over {bound} bytes: "
                               "write.chunk-bytes, write.max-message-bytes); give every server of the cluster "
                               "the same write options")
    return pa.Table.from_batches(pending, reader.schema)
