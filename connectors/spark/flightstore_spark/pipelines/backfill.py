"""The delta join's backfill from the lake (``--startup-mode lake``): join the two tables' lake
snapshots in Spark batch mode, write the sink, and hand the streaming delta join the offsets those
snapshots recorded.

A table's lake snapshot holds exactly its rows below the per-bucket offsets the snapshot recorded
(the tierer commits files and offsets in one swap), so the sink written from the two snapshots is
the join as of those offsets, and the stream that continues from exactly them sees every later
change once: no gap, no duplicate. The join is Spark's own sort-merge join over the Iceberg data
files, read by the executors straight from the warehouse (a primary-key table's position deletes
applied on the way), not a replay of the changelog through lookups; that is what makes a day's
backfill minutes instead of hours.

What a backfill costs beyond the join itself was cut where a profile found it (bench
``BENCH_SPARK_MEASURES=backfill python -m bench spark``): the driver plans both snapshots (one call
to the server each) and the executors read them with ``mapInArrow`` in at most one task per core
(:func:`read_snapshot`), and each task of the join writes its rows to the sink with ``mapInArrow``
as Arrow batches (:func:`write_sink`). A Python data source read and write would each start
planner Python workers on the driver (schema, filter pushdown, partitions, writer, commit: a fresh
process and imports each on a busy machine, seconds before any row moves), and a task per data
file paid Spark's per-task cost again. The executors import pyarrow only, never pyiceberg
(:mod:`flightstore.lake.direct`).

Crash safety: before the batch job starts, the snapshots and their offsets are recorded in
``<checkpoint>/backfill.json`` (``planned``); once the sink is written the record says
``written``. A job killed during the backfill redoes it on restart from the same snapshots (the
sink's upserts are idempotent and no streamed change was applied yet); a job killed later skips it
and the streaming query resumes from its own checkpoint (``<checkpoint>/stream``), whose first
micro-batch starts at the recorded offsets. The sink must be empty when a backfill first starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from flightstore_spark import _flight

__all__ = ["backfill", "plan_snapshots", "read_snapshot", "write_sink"]

RECORD = "backfill.json"


def plan_snapshots(uri: str, tables: dict[str, str]) -> dict[str, dict]:
    """The current lake snapshot of each of ``tables`` (``{"left": name, ...}``): its id and the
    offsets it recorded; every bucket must be in the lake."""
    planned = {}
    with _flight.open_connection(uri) as conn:
        for side, table in tables.items():
            split = _flight.lake_split(conn, table, lake_only=True)
            if "snapshot_id" not in split:
                raise ValueError(f"table {table} is not datalake-enabled ('table.datalake.enabled' = 'true'): "
                                 "no lake to backfill from")
            if split["snapshot_id"] is None:
                raise ValueError(f"table {table} has no lake snapshot yet: nothing tiered to backfill from")
            planned[side] = {"table": table, "snapshot_id": int(split["snapshot_id"]),
                             "offsets": {str(b): int(o) for b, o in split["offsets"].items()}}
    return planned


def read_snapshot(spark, uri: str, table: str, snapshot_id: int, columns: Sequence[str],
                  partitions: int | None = None):
    """A DataFrame of ``columns`` of one lake snapshot of ``table``, planned here (the server's
    plan of the snapshot: data files, their position delete files, checks) and read by the
    executors straight from the warehouse in at most ``partitions`` tasks (default: Spark's
    default parallelism, one task per core), files shared out by rows."""
    from pyspark.sql.types import StructType

    from flightstore_spark.source import lake_snapshot_splits, read_lake_split, spark_schema

    options = _flight.Options({"uri": uri, "table": table})
    with options.connect() as conn:
        planned = _flight.lake_split(conn, table, None, int(snapshot_id), lake_only=True)
        if "files" not in planned:
            raise ValueError(f"table {table} is not datalake-enabled: no lake snapshot to read")
        arrow = _flight.custom_schema(conn, {"op": "scan", "table": table, "columns": list(columns)})
    schema: StructType = spark_schema(arrow)
    most = partitions or int(spark.sparkContext.defaultParallelism)
    splits = lake_snapshot_splits(planned, _flight.lake_io(options, planned), list(columns), None, most)
    if not splits:
        return spark.createDataFrame([], schema)

    def read(batches):  # one input row per task: the index of its split
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_lake_split(splits[index], schema)

    return spark.range(0, len(splits), 1, len(splits)).mapInArrow(read, schema)


def write_sink(joined, uri: str, sink: str) -> int:
    """Upsert the rows of ``joined`` into ``sink``, each task its partition as Arrow batches
    (chunks of :data:`~flightstore_spark.writer.CHUNK_ROWS` per DoPut, the batch writer's own
    ``write``); returns the rows written."""
    from flightstore_spark.writer import FlightstoreWriter

    writer = FlightstoreWriter({"uri": uri, "table": sink}, joined.schema, False)

    def write(batches):
        message = writer.write(batches)
        yield pa.RecordBatch.from_pydict({"rows": [message.rows]}, schema=WRITTEN)

    return sum(row["rows"] for row in joined.mapInArrow(write, "rows long").collect())


WRITTEN = pa.schema([("rows", pa.int64())])


def _write_record(path: Path, record: dict) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as out:
        json.dump(record, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def backfill(spark, uri: str, left: str, right: str, key: Sequence[str], sink: str, checkpoint: str, *,
             join_type: str = "left") -> dict[str, dict[int, int]]:
    """Backfill ``sink`` from the lake (or find it done in ``checkpoint``); returns the offsets
    the stream starts at: ``{"left": {bucket: offset}, "right": {...}}``."""
    from flightstore_spark.pipelines.delta_join import DeltaJoin

    join = DeltaJoin.resolve(uri, left, right, sink, key, join_type=join_type)
    path = Path(checkpoint) / RECORD
    record = json.loads(path.read_text()) if path.exists() else None
    recorded = None if record is None else (record["left"]["table"], record["right"]["table"], record["sink"])
    if recorded is not None and recorded != (left, right, sink):
        raise ValueError(f"checkpoint {checkpoint} belongs to a backfill of {record['left']['table']} and "
                         f"{record['right']['table']} into {record['sink']}")
    if record is None:
        with _flight.open_connection(uri) as conn:
            if conn.table(sink).row_count():
                raise ValueError(f"the sink {sink} is not empty: a backfill writes a fresh sink")
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"state": "planned", "sink": sink, **plan_snapshots(uri, {"left": left, "right": right})}
        _write_record(path, record)
    if record["state"] != "written":
        left_df = read_snapshot(spark, uri, left, record["left"]["snapshot_id"], join.left_columns)
        right_df = read_snapshot(spark, uri, right, record["right"]["snapshot_id"],
                                 join.key + join.right_columns)
        joined = left_df.join(right_df.hint("merge"), on=list(join.key), how=join.join_type)
        write_sink(joined.select(*join.left_columns, *join.right_columns), uri, sink)
        record["state"] = "written"
        _write_record(path, record)
    return {side: {int(b): int(o) for b, o in record[side]["offsets"].items()} for side in ("left", "right")}
