"""``df.write`` / ``df.writeStream`` ``.format("flightstore")``: Arrow batches over DoPut.

* log table: append;
* primary-key table: upsert (``columns`` = ``a,b`` for a partial update, which must include the key);
  with a ``_change_type`` column the rows are written as a changelog: ``-D`` deletes, ``+I``/``+U``
  upsert, ``-U`` is dropped (the following ``+U`` carries the new row). ``_log_offset`` and
  ``_commit_timestamp`` of a changelog read are dropped, so a changelog stream can be copied.

Exactly-once for streaming writes: a task writes its whole partition of a micro-batch as one DoPut
with writer id ``spark-<query id>-<partition>-<batch id>`` and batch sequence 0. A retried task or a
replayed micro-batch sends the same writer id and sequence, which the server recognizes as a
duplicate and does not apply again. Batch writes use a fresh writer id per task attempt and number
their chunks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from flightstore_spark import _flight

__all__ = ["FlightstoreStreamWriter", "FlightstoreWriter", "WriteMessage", "prepare", "stream_writer_id"]

CHUNK_ROWS = 262_144
DROPPED = ("_log_offset", "_commit_timestamp")


@dataclass
class WriteMessage(WriterCommitMessage):
    rows: int
    duplicate: bool
    writer_id: str


def prepare(data: pa.Table, primary_key: bool) -> tuple[str, pa.Table]:
    """The write command and the rows to send for ``data`` (see the module doc)."""
    data = data.drop_columns([c for c in DROPPED if c in data.column_names])
    if "_change_type" not in data.column_names:
        return ("upsert" if primary_key else "append"), data
    if primary_key:
        data = data.filter(pc.not_equal(data.column("_change_type"), "-U"))
        return "write", data
    return "append", data.drop_columns(["_change_type"])


class _Base:
    def __init__(self, options: dict, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("flightstore does not support overwrite; use mode('append') (upserts on "
                             "primary-key tables)")
        self.options = _flight.Options(options)
        if not self.options.table:
            raise ValueError("writing to flightstore needs option('table', 'db.t')")
        with self.options.connect() as conn:
            self.primary_key = bool(_flight.primary_key(conn, self.options.table))

    def _send(self, conn, data: pa.Table, writer_id: str, sequence: int, check_applied: bool = False) -> dict:
        op, rows = prepare(data, self.primary_key)
        if rows.num_rows == 0:
            return {"rows": 0, "duplicate": False}
        columns = self.options.columns if op in ("upsert", "write") else None
        return _flight.put_once(conn, op, self.options.table, rows, writer_id=writer_id,
                                sequence=sequence, columns=columns, check_applied=check_applied)


class FlightstoreWriter(_Base, DataSourceArrowWriter):
    """Batch writes: chunks of up to 256k rows per DoPut, one writer id per task attempt."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteMessage:
        writer_id = f"spark-batch-{uuid.uuid4().hex}"
        rows, sequence, pending, pending_rows = 0, 0, [], 0
        with self.options.connect() as conn:
            def flush() -> None:
                nonlocal sequence, pending, pending_rows, rows
                if pending_rows:
                    self._send(conn, pa.Table.from_batches(pending), writer_id, sequence)
                    sequence += 1
                    rows += pending_rows
                pending, pending_rows = [], 0

            for batch in iterator:
                if batch.num_rows:
                    pending.append(batch)
                    pending_rows += batch.num_rows
                if pending_rows >= CHUNK_ROWS:
                    flush()
            flush()
        return WriteMessage(rows, False, writer_id)


def stream_writer_id(query_id: str, partition: int, batch_id: int) -> str:
    return f"spark-{query_id}-{partition}-{batch_id}"


class FlightstoreStreamWriter(_Base, DataSourceStreamArrowWriter):
    """Streaming writes, exactly once per (query, partition, micro-batch)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if query_id is None or batch_id is None:
            raise RuntimeError("the flightstore stream writer runs inside a micro-batch streaming query")
        writer_id = stream_writer_id(query_id, context.partitionId(), int(batch_id))
        batches = [b for b in iterator if b.num_rows]
        if not batches:
            return WriteMessage(0, False, writer_id)
        with self.options.connect() as conn:
            result = self._send(conn, pa.Table.from_batches(batches), writer_id, 0, check_applied=True)
        return WriteMessage(int(result.get("rows", 0)), bool(result.get("duplicate")), writer_id)

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass
