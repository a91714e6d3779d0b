"""Cutting results into Flight messages well below gRPC's message limit.

Every result the server streams (DoGet of queries, lookups, scans, subscriptions, metadata and
kept results) is cut here: at most ``max_rows`` rows (the server option ``server.max-batch-rows``)
and about :data:`MAX_BATCH_BYTES` bytes per message, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_ROWS", "rechunk"]

# Flight messages of at most 2 MiB: the client decodes one while the next is on the wire. A 24 MB
# (10-of-100 column) scan took 14-17 ms with 4 MiB messages, 8-13 ms with 2 MiB; 1 MiB was faster
# still for it but slowed the 130 MB full scan (python -m bench server, /tmp A/B runs).
MAX_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_ROWS = 65_536  # the default of ``server.max-batch-rows``
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()  # built once: the default reads os.environ each time


def rechunk(batches: Iterator[pa.RecordBatch | pa.Table], max_rows: int = MAX_BATCH_ROWS,
            keep_empty: bool = False) -> Iterator[pa.Table | pa.RecordBatch]:
    """Cut batches into Flight messages of at most ``max_rows`` rows and :data:`MAX_BATCH_BYTES`
    (far below gRPC's 16 MiB limit). Each input batch comes out as one table of zero-copy slices:
    pyarrow streams a table's chunks from C++, so Python runs once per stored batch, not once per
    message. Empty batches are dropped, unless ``keep_empty`` (a subscription's heartbeats are
    empty batches)."""
    for item in batches:
        for batch in (item.to_batches() if isinstance(item, pa.Table) else [item]):
            if batch.num_rows == 0:
                if keep_empty:
                    yield batch
                continue
            per_row = max(1, batch.nbytes // max(batch.num_rows, 1))
            step = max(1, min(max_rows, MAX_BATCH_BYTES // per_row))
            yield pa.Table.from_batches([batch.slice(start, step)
                                         for start in range(0, batch.num_rows, step)], batch.schema)


def _messages(table: pa.Table, max_rows: int = MAX_BATCH_ROWS) -> pa.Table:
    """``table`` with its chunks cut into Flight messages (as :func:`rechunk` does), zero-copy."""
    if table.num_rows <= max_rows and table.get_total_buffer_size() <= MAX_BATCH_BYTES:
        return table  # small (a lookup's rows): every chunk is a message already
    return pa.Table.from_batches([batch for part in rechunk(iter([table]), max_rows)
                                  for batch in part.to_batches()], table.schema)
