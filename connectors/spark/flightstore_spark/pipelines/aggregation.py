"""Aggregation in storage: raw events stream into an aggregation-merge-engine table, which folds them
(``'table.merge-engine' = 'aggregation'``, ``'fields.<f>.agg' = 'sum'`` ...); Spark keeps no state.

Each micro-batch is written with the exactly-once streaming writer (writer id per query, partition
and batch), which matters here: a replayed batch applied twice would double-count.

    python -m flightstore_spark.pipelines.aggregation --uri grpc://127.0.0.1:8815 \\
        --source db.clicks --sink db.clicks_per_user --columns user_id,clicks,amount --checkpoint /tmp/agg
"""

from __future__ import annotations

from collections.abc import Sequence

from flightstore_spark.pipelines._common import local_spark, pipeline_parser, with_trigger

__all__ = ["main", "spark_groupby", "start"]


def start(spark, uri: str, source: str, sink: str, columns: Sequence[str], checkpoint: str, *,
          trigger: str = "availableNow", startup_mode: str = "earliest"):
    """Stream ``source``'s appended rows (``columns`` of them) into the aggregation table ``sink``."""
    from pyspark.sql import functions as F

    events = (spark.readStream.format("flightstore").option("uri", uri).option("table", source)
              .option("startup.mode", startup_mode).load()
              .filter(F.col("_change_type").isin("+A", "+I", "+U")).select(*columns))
    writer = (events.writeStream.format("flightstore").option("uri", uri).option("table", sink)
              .option("columns", ",".join(columns)).option("checkpointLocation", checkpoint))
    return with_trigger(writer, trigger).start()


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
