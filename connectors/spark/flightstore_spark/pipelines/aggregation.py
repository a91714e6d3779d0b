"""Aggregation in storage: raw events stream into an aggregation-merge-engine table, which folds them
(``'table.merge-engine' = 'aggregation'``, ``'fields.<f>.agg' = 'sum'`` ...), each micro-batch first
combined per key in Spark when the table's functions allow it; Spark keeps no state.

When every field of the table aggregates with an order-free function (``sum``, ``max``, ``min``:
:func:`flightstore_spark.writer.foldable_aggregation`), each micro-batch is first combined in Spark
as a stateless batch aggregation (``foreachBatch``: ``groupBy(key).agg(...)``, shuffle partitions
sized to the cores) and only its rows, one per key, are written; the table's merge engine folds
them across micro-batches (Flink's mini-batch local-global aggregation, the global part in
storage). Floating-point ``max``/``min`` are not combined in Spark (Spark orders NaN above every
number, the table skips it), nor are order-dependent functions (``last_value``, ``listagg``...):
those tables get every event through the exactly-once streaming writer.

The combined rows (one per key the micro-batch touched) come to the driver as Arrow and are
written from there: no Python worker sees the events (the driver holds a micro-batch's keys once,
as Spark's memory sink holds all of a groupBy's).

Exactly-once: the combined rows are split into shards by a hash of the key (as many shards as
the table has buckets, a number that does not change), and each shard is written as one DoPut
with writer id ``spark-agg-<query id>-<batch id>-<shard>`` and sequence 0. A replayed micro-batch
(same rows, from the checkpoint's offsets) sends the same ids, which the server recognizes as
duplicates: applied twice, a batch would double-count. The ids do not depend on how Spark
partitioned the batch.

    python -m flightstore_spark.pipelines.aggregation --uri grpc://127.0.0.1:8815 \\
        --source db.clicks --sink db.clicks_per_user --columns user_id,clicks,amount --checkpoint /tmp/agg
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore_spark import _flight
from flightstore_spark.pipelines._common import local_spark, pipeline_parser, query_identity, with_trigger
from flightstore_spark.writer import foldable_aggregation

__all__ = ["Combine", "main", "spark_groupby", "start"]

SHARD = "_shard"


@dataclass(frozen=True)
class Combine:
    """How a micro-batch of events is combined in Spark and written to the aggregation table."""

    uri: str
    sink: str
    key: tuple[str, ...]
    functions: tuple[tuple[str, str], ...]  # (written field, sum/max/min) in the written order
    shards: int

    @classmethod
    def resolve(cls, uri: str, sink: str, columns: Sequence[str]) -> Combine | None:
        """The combination for writing ``columns`` to ``sink``; None when the events must be
        written one by one (not an aggregation table, a function that is not order-free, a
        floating-point max/min, or the key not written)."""
        with _flight.open_connection(uri) as conn:
            info = _flight.table_info(conn, sink)
            fold = foldable_aggregation(conn, sink, info.primary_key) if info.primary_key else None
        if fold is None or not set(info.primary_key) <= set(columns):
            return None
        key, functions = fold
        written = [(c, functions[c]) for c in columns if c not in key]
        if any(f != "sum" and pa.types.is_floating(info.schema.field(c).type) for c, f in written):
            return None
        return cls(uri, sink, tuple(key), tuple(written), max(1, info.num_buckets))

    @property
    def columns(self) -> list[str]:
        return [*self.key, *(c for c, _ in self.functions)]

    def combined(self, events, shuffle_partitions: int):
        """``events`` (a micro-batch DataFrame) as one row per key, with its shard."""
        from pyspark.sql import functions as F

        events.sparkSession.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        spark_function = {"sum": F.sum, "max": F.max, "min": F.min}
        types = {f.name: f.dataType for f in events.schema.fields}
        grouped = events.groupBy(*self.key).agg(*[spark_function[f](F.col(c)).cast(types[c]).alias(c)
                                                  for c, f in self.functions])
        return grouped.withColumn(SHARD, F.pmod(F.hash(*self.key), F.lit(self.shards)).cast("int"))

    def foreach_batch(self, name: str):
        """The micro-batch function: combine, then write each shard exactly once (no Spark state)."""
        combine = self

        def process(df, batch_id: int) -> None:
            session = df.sparkSession
            prefix = f"spark-agg-{query_identity(session, name)}-{batch_id}"
            rows = combine.combined(df, session.sparkContext.defaultParallelism).toArrow()
            combine.write(rows, prefix)

        return process

    def write(self, rows: pa.Table, prefix: str) -> list[dict]:
        """Write combined rows, one DoPut per shard (see the module doc); the server's answers."""
        if rows.num_rows == 0:
            return []
        shard_of = rows.column(SHARD)
        rows = rows.drop_columns([SHARD])
        conn = _flight.shared_connection(self.uri)  # the driver's, kept across micro-batches
        return [_flight.put_once(conn, "upsert", self.sink, rows.filter(pc.equal(shard_of, shard)),
                                 writer_id=f"{prefix}-{shard}", sequence=0, columns=self.columns, check_applied=True)
                for shard in np.unique(shard_of.to_numpy()).tolist()]


def start(spark, uri: str, source: str, sink: str, columns: Sequence[str], checkpoint: str, *,
          trigger: str = "availableNow", startup_mode: str = "earliest"):
    """Stream ``source``'s appended rows (``columns`` of them) into the aggregation table ``sink``,
    combined per micro-batch in Spark when its functions allow it (see the module doc)."""
    from pyspark.sql import functions as F

    events = (spark.readStream.format("flightstore").option("uri", uri).option("table", source)
              .option("startup.mode", startup_mode).load()
              .filter(F.col("_change_type").isin("+A", "+I", "+U")).select(*columns))
    combine = Combine.resolve(uri, sink, columns)
    if combine is None:
        writer = (events.writeStream.format("flightstore").option("uri", uri).option("table", sink)
                  .option("columns", ",".join(columns)))
    else:
        writer = events.writeStream.foreachBatch(combine.foreach_batch(f"{source}-{sink}"))
    return with_trigger(writer.option("checkpointLocation", checkpoint), trigger).start()


def spark_groupby(spark, uri: str, source: str, key: Sequence[str], sums: Sequence[str], checkpoint: str,
                  query_name: str, wait: bool = True):
    """The same result computed by Spark's own streaming groupBy (complete mode, memory sink);
    returns the query, finished unless ``wait`` is False (its state lives in Spark's state store)."""
    from pyspark.sql import functions as F

    events = (spark.readStream.format("flightstore").option("uri", uri).option("table", source)
              .option("startup.mode", "earliest").load())
    agg = events.groupBy(*key).agg(*[F.sum(c).alias(c) for c in sums])
    query = (agg.writeStream.outputMode("complete").format("memory").queryName(query_name)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    if wait:
        query.awaitTermination()
    return query


def main(argv: Sequence[str] | None = None) -> None:
    parser = pipeline_parser("aggregation", __doc__)
    parser.add_argument("--source", required=True, help="table of raw events")
    parser.add_argument("--sink", required=True, help="aggregation merge engine table")
    parser.add_argument("--columns", required=True, help="key and aggregated columns, comma separated")
    args = parser.parse_args(argv)
    spark = local_spark(args.master, "flightstore-aggregation")
    start(spark, args.uri, args.source, args.sink, args.columns.split(","), args.checkpoint,
          trigger=args.trigger).awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
