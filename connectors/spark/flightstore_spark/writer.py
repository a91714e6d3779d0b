"""``df.write`` / ``df.writeStream`` ``.format("flightstore")``: Arrow batches over DoPut.

* log table: append;
* primary-key table: upsert (``columns`` = ``a,b`` for a partial update, which must include the key);
  with a ``_change_type`` column the rows are written as a changelog: ``-D`` deletes, ``+I``/``+U``
  upsert, ``-U`` is dropped (the following ``+U`` carries the new row). ``_log_offset`` and
  ``_commit_timestamp`` of a changelog read are dropped, so a changelog stream can be copied.

Into an aggregation merge engine table (``'table.merge-engine' = 'aggregation'``) whose written
fields all aggregate with ``sum``, ``max`` or ``min``, a task first folds its rows per primary key
(numpy over the rows sorted by key, Arrow's hash aggregation for non-numeric fields; the same
null handling as the server's functions): the server merges
one row per key and task instead of every event, and the table's changelog holds one change per
key and micro-batch. Other functions (``last_value``, ``listagg``...) depend on the order of the
rows and are written row by row, as are changelog writes (``_change_type``).

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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from flightstore_spark import _flight
from flightstore_spark.arrays import from_numpy, to_numpy, valid_mask
from flightstore_spark.keys import key_groups

__all__ = ["FlightstoreStreamWriter", "FlightstoreWriter", "WriteMessage", "fold_aggregation", "foldable_aggregation",
           "prepare", "stream_writer_id"]

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


FOLDABLE = ("sum", "max", "min")  # order-free functions a task may apply to its rows first


def foldable_aggregation(conn, table: str, key: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """``(primary key, {field: function})`` when ``table`` is an aggregation table whose every
    non-key field aggregates with an order-free function (:data:`FOLDABLE`); else None."""
    import json

    options = json.loads(conn.table(table).describe()["descriptor"]).get("options", {})
    if str(options.get("table.merge-engine", "")).lower() != "aggregation":
        return None
    functions = {}
    for name in _flight.custom_schema(conn, {"op": "scan", "table": table}).names:
        if name in key:
            continue
        function = str(options.get(f"fields.{name}.agg", "last_value_ignore_nulls")).strip().lower()
        if function not in FOLDABLE:
            return None
        functions[name] = function
    return key, functions


def fold_aggregation(rows: pa.Table, key: list[str], functions: dict[str, str]) -> pa.Table:
    """One row per key of ``rows``, its written fields folded by their functions (fields not
    written stay unwritten: a partial update names the same columns).

    Integer and floating-point fields fold with numpy over the rows sorted by key (sum, max and
    min skip nulls; a key whose values are all null folds to null, as the server's functions do).
    Other types (decimals, temporal, strings) and NaN under max/min fold with Arrow's hash
    aggregation. Numpy matters on an executor: ``Table.group_by`` imports ``pyarrow.acero`` and
    with it pandas, seconds of CPU in every fresh Python worker."""
    if rows.num_rows < 2 or any(c not in rows.column_names for c in key):
        return rows
    fields = [c for c in rows.column_names if c not in key]
    if any(c not in functions for c in fields):
        return rows
    if not all(_numpy_foldable(rows.column(c), functions[c]) for c in fields):
        return _fold_hash(rows, key, fields, functions)
    if any(rows.column(c).null_count for c in key):  # the server names the error
        return rows
    group = key_groups(rows, key)
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_group[1:] != sorted_group[:-1]]))
    folded = rows.select(key).take(from_numpy(order[starts]))
    for name in fields:
        column = rows.column(name).combine_chunks()
        folded = folded.append_column(name, _fold_numeric(column, functions[name], order, starts))
    return folded.select(rows.column_names).cast(rows.schema)


_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _numpy_foldable(column: pa.ChunkedArray, function: str) -> bool:
    kind = column.type
    if pa.types.is_integer(kind):
        return True
    if not pa.types.is_floating(kind) or pa.types.is_float16(kind):
        return False
    return function == "sum" or not pc.any(pc.is_nan(column)).as_py()  # Arrow's max/min skip NaN


def _fold_numeric(column: pa.Array, function: str, order: np.ndarray, starts: np.ndarray) -> pa.Array:
    """``function`` of ``column`` per run of ``order`` beginning at ``starts``, nulls skipped
    (accumulated in 64 bits; the caller casts back to the column's type, checking the range)."""
    kind = column.type
    if pa.types.is_floating(kind):
        wide, identity = np.float64, {"sum": 0.0, "max": -np.inf, "min": np.inf}[function]
    else:
        wide = np.uint64 if pa.types.is_unsigned_integer(kind) else np.int64
        identity = {"sum": 0, "max": np.iinfo(wide).min, "min": np.iinfo(wide).max}[function]
    values = to_numpy(column).astype(wide)  # a copy: writable
    if not column.null_count:
        return from_numpy(_REDUCE[function].reduceat(values[order], starts))
    valid = valid_mask(column)
    values[~valid] = identity
    result = _REDUCE[function].reduceat(values[order], starts)
    return from_numpy(result, valid=np.add.reduceat(valid[order].astype(np.int64), starts) > 0)


def _fold_hash(rows: pa.Table, key: list[str], fields: list[str], functions: dict[str, str]) -> pa.Table:
    folded = rows.group_by(key, use_threads=False).aggregate([(c, functions[c]) for c in fields])
    folded = folded.rename_columns([f"{c}_{functions[c]}" if c in fields else c for c in folded.column_names])
    return folded.select([f"{c}_{functions[c]}" if c in fields else c for c in rows.column_names]) \
        .rename_columns(rows.column_names).cast(rows.schema)


class _Base:
    def __init__(self, options: dict, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("flightstore does not support overwrite; use mode('append') (upserts on "
                             "primary-key tables)")
        self.options = _flight.Options(options)
        if not self.options.table:
            raise ValueError("writing to flightstore needs option('table', 'db.t')")
        with self.options.connect() as conn:
            key = _flight.primary_key(conn, self.options.table)
            self.primary_key = bool(key)
            self.fold = foldable_aggregation(conn, self.options.table, key) if key else None

    def _send(self, conn, data: pa.Table, writer_id: str, sequence: int, check_applied: bool = False) -> dict:
        op, rows = prepare(data, self.primary_key)
        if op == "upsert" and self.fold is not None:
            rows = fold_aggregation(rows, *self.fold)
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
