"""Delta join: ``left LEFT JOIN right ON key`` maintained in a flightstore primary-key sink, with no
join state in Spark.

``left`` and ``right`` are primary-key tables; ``right``'s primary key is the join key and both are
bucketed by it (``left``'s primary key starts with it). The sink has ``left``'s primary key and
columns plus ``right``'s non-key columns. One streaming query subscribes to both changelogs; every
micro-batch is shuffled by the join key so all changes of a key meet in one task, which folds them
to the last change per primary key and then

* left ``+I``/``+U``: looks up ``right`` by key (one batched prefix lookup on the server) and upserts
  the whole wide row; left ``-D``: deletes the sink row;
* right ``+I``/``+U``/``-D``: looks up the ``left`` rows of the key (batched prefix lookup, keys only)
  and partially updates ``right``'s columns of those sink rows (nulls for ``-D``).

The storage holds the state (both tables); Spark keeps none. Each write is one DoPut with writer id
``<query id>-<batch>-<partition>-<step>`` and sequence 0, so a replayed micro-batch is not applied
twice. Once both streams are drained the sink equals the batch join of the two tables.

    python -m flightstore_spark.pipelines.delta_join --uri grpc://127.0.0.1:8815 \\
        --left db.orders --right db.customers --key customer_id --sink db.orders_wide \\
        --checkpoint /tmp/dj [--trigger availableNow|<seconds>] [--startup-mode earliest|full]
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from flightstore_spark import _flight
from flightstore_spark.pipelines._common import (
    distinct_keys,
    fold_last,
    local_spark,
    match_rows,
    pipeline_parser,
    query_identity,
    with_trigger,
)

__all__ = ["DeltaJoin", "main", "start", "stream_stream_join_state"]

UPSERT_KINDS = pa.array(["+I", "+U", "+A"])


@dataclass
class DeltaJoin:
    """The join's shape (picklable, shipped to the tasks)."""

    uri: str
    left: str
    right: str
    sink: str
    key: list[str]
    left_key: list[str]
    left_columns: list[str]
    right_columns: list[str]  # right's non-key columns

    @classmethod
    def resolve(cls, uri: str, left: str, right: str, sink: str | None, key: Sequence[str]) -> DeltaJoin:
        """Check the tables' shapes on the server (``sink`` None: only the two inputs)."""
        key = list(key)
        with _flight.open_connection(uri) as conn:
            left_info, right_info = _flight.table_info(conn, left), _flight.table_info(conn, right)
            sink_info = _flight.table_info(conn, sink) if sink else None
        if list(right_info.primary_key) != key:
            raise ValueError(f"the join key {key} must be the primary key of {right} "
                             f"({right_info.primary_key})")
        if list(left_info.primary_key[:len(key)]) != key:
            raise ValueError(f"the primary key of {left} ({left_info.primary_key}) must start with the "
                             f"join key {key}")
        right_columns = [c for c in right_info.schema.names if c not in key]
        clash = [c for c in right_columns if c in left_info.schema.names]
        if clash:
            raise ValueError(f"columns {clash} are in both {left} and {right}; rename one side")
        wide = left_info.schema.names + right_columns
        if sink_info is not None and (sorted(sink_info.schema.names) != sorted(wide)
                                      or sink_info.primary_key != left_info.primary_key):
            raise ValueError(f"the sink {sink} needs columns {wide} and primary key {left_info.primary_key}")
        return cls(uri, left, right, sink or "", key, list(left_info.primary_key), list(left_info.schema.names),
                   right_columns)

    # ---- one task of one micro-batch ----------------------------------------------------------
    def apply(self, changes: pa.Table, writer_prefix: str) -> dict[str, int]:
        """Apply one task's changes (``_side`` L/R, in log order per key) to the sink."""
        written = {"left_upserts": 0, "left_deletes": 0, "right_updates": 0}
        side = changes.column("_side")
        left = changes.filter(pc.equal(side, "L"))
        right = changes.filter(pc.equal(side, "R"))
        with _flight.open_connection(self.uri) as conn:
            if left.num_rows:
                left = fold_last(left, self.left_key)
                kinds = left.column("_change_type")
                deletes = left.filter(pc.equal(kinds, "-D")).select(self.left_key)
                upserts = left.filter(pc.is_in(kinds, UPSERT_KINDS)).select(self.left_columns)
                if deletes.num_rows:
                    _flight.put_once(conn, "delete", self.sink, deletes, writer_id=f"{writer_prefix}-ld",
                                     sequence=0, check_applied=True)
                    written["left_deletes"] = deletes.num_rows
                if upserts.num_rows:
                    found = conn.table(self.right).prefix_lookup(
                        distinct_keys(upserts, self.key), columns=self.key + self.right_columns)
                    at = match_rows(upserts, found, self.key)
                    wide = upserts
                    for name in self.right_columns:
                        wide = wide.append_column(name, found.column(name).take(at))
                    _flight.put_once(conn, "upsert", self.sink, wide, writer_id=f"{writer_prefix}-lu",
                                     sequence=0, check_applied=True)
                    written["left_upserts"] = wide.num_rows
            if right.num_rows:
                right = fold_last(right, self.key)
                right = right.filter(pc.is_in(right.column("_change_type"),
                                              pa.concat_arrays([UPSERT_KINDS, pa.array(["-D"])])))
                if right.num_rows:
                    deleted = pc.equal(right.column("_change_type"), "-D")
                    values = right.select(self.key)
                    for name in self.right_columns:
                        column = right.column(name)
                        values = values.append_column(
                            name, pc.if_else(deleted, pa.nulls(len(column), column.type), column))
                    rows = conn.table(self.left).prefix_lookup(distinct_keys(values, self.key),
                                                               columns=self.left_key)
                    if rows.num_rows:
                        at = match_rows(rows, values, self.key)
                        for name in self.right_columns:
                            rows = rows.append_column(name, values.column(name).take(at))
                        _flight.put_once(conn, "upsert", self.sink, rows, writer_id=f"{writer_prefix}-r",
                                         sequence=0, columns=self.left_key + self.right_columns,
                                         check_applied=True)
                        written["right_updates"] = rows.num_rows
        return written

    # ---- Spark plumbing -----------------------------------------------------------------------
    def changes(self, spark, startup_mode: str = "earliest", max_rows: int | None = None):
        """Both changelogs as one stream: ``_side``, the wide columns, ``_change_type``, ``_log_offset``."""
        from pyspark.sql import functions as F

        def side(table: str, tag: str, columns: list[str]):
            reader = (spark.readStream.format("flightstore").option("uri", self.uri).option("table", table)
                      .option("startup.mode", startup_mode))
            if max_rows:
                reader = reader.option("maxRowsPerTrigger", str(max_rows))
            df = reader.load()
            return df.select(F.lit(tag).alias("_side"), *columns, "_change_type", "_log_offset")

        left = side(self.left, "L", self.left_columns)
        right = side(self.right, "R", self.key + self.right_columns)
        return left.unionByName(right, allowMissingColumns=True)

    def foreach_batch(self, name: str):
        join = self

        def process(df, batch_id: int) -> None:
            session = df.sparkSession
            session.dataSource.register(DeltaJoinSink)
            prefix = f"dj-{query_identity(session, name)}-{batch_id}"
            partitions = int(session.conf.get("spark.sql.shuffle.partitions"))
            (df.repartition(partitions, *join.key).sortWithinPartitions("_log_offset")
               .write.format(DeltaJoinSink.name()).option("join", json.dumps(asdict(join)))
               .option("prefix", prefix).mode("append").save())

        return process


class DeltaJoinSink(DataSource):
    """Applies one micro-batch's changes, task by task, with Arrow batches (no pandas needed)."""

    @classmethod
    def name(cls) -> str:
        return "flightstore_delta_join"

    def writer(self, schema, overwrite: bool) -> DeltaJoinWriter:
        return DeltaJoinWriter(DeltaJoin(**json.loads(self.options["join"])), self.options["prefix"])


class DeltaJoinWriter(DataSourceArrowWriter):
    def __init__(self, join: DeltaJoin, prefix: str) -> None:
        self.join = join
        self.prefix = prefix

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        batches = [b for b in iterator if b.num_rows]
        if batches:
            self.join.apply(pa.Table.from_batches(batches), f"{self.prefix}-{TaskContext.get().partitionId()}")
        return WriterCommitMessage()


def start(spark, uri: str, left: str, right: str, key: Sequence[str], sink: str, checkpoint: str, *,
          trigger: str = "availableNow", startup_mode: str = "earliest", max_rows: int | None = None,
          name: str | None = None):
    """Start the delta join; returns the StreamingQuery."""
    join = DeltaJoin.resolve(uri, left, right, sink, key)
    writer = (join.changes(spark, startup_mode, max_rows).writeStream
              .foreachBatch(join.foreach_batch(name or f"{left}-{right}-{sink}"))
              .option("checkpointLocation", checkpoint))
    writer = with_trigger(writer, trigger)
    return writer.start()


def stream_stream_join_state(spark, uri: str, left: str, right: str, key: Sequence[str],
                             checkpoint: str) -> dict[str, int]:
    """The same join as a Spark stream-stream join (inner join of the two changelogs' upserts, no
    watermark: Spark must keep both sides); returns its state store size after draining."""
    join = DeltaJoin.resolve(uri, left, right, None, key)
    from pyspark.sql import functions as F

    def side(table: str, columns: list[str], alias: str):
        df = (spark.readStream.format("flightstore").option("uri", uri).option("table", table)
              .option("startup.mode", "earliest").load())
        df = df.filter(F.col("_change_type").isin("+I", "+U", "+A")).select(*columns)
        return df.alias(alias)

    left_df = side(left, join.left_columns, "l")
    right_df = side(right, join.key + join.right_columns, "r")
    joined = left_df.join(right_df, on=list(join.key), how="inner")
    query = (joined.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    progress = query.lastProgress or {}
    operators = progress.get("stateOperators", [])
    return {"memoryUsedBytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
            "numRowsTotal": sum(int(op.get("numRowsTotal", 0)) for op in operators)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = pipeline_parser("delta_join", __doc__)
    parser.add_argument("--left", required=True, help="primary-key table whose key starts with --key")
    parser.add_argument("--right", required=True, help="primary-key table keyed by --key")
    parser.add_argument("--key", required=True, help="join key column(s), comma separated")
    parser.add_argument("--sink", required=True, help="primary-key table: left's key, left + right columns")
    parser.add_argument("--startup-mode", default="earliest", choices=["earliest", "full", "latest"])
    parser.add_argument("--max-rows-per-trigger", type=int, default=None)
    args = parser.parse_args(argv)
    spark = local_spark(args.master, "flightstore-delta-join")
    query = start(spark, args.uri, args.left, args.right, args.key.split(","), args.sink, args.checkpoint,
                  trigger=args.trigger, startup_mode=args.startup_mode, max_rows=args.max_rows_per_trigger)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
