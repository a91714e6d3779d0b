"""PySpark connector for flightstore (Python Data Source API, format ``flightstore``).

    import flightstore_spark
    flightstore_spark.register(spark)
    df = spark.read.format("flightstore").option("uri", uri).option("table", "db.t").load()

See :mod:`flightstore_spark.source` (batch reads), :mod:`flightstore_spark.stream` (changelog
streaming reads) and :mod:`flightstore_spark.writer` (batch and streaming writes), and the pipelines
in :mod:`flightstore_spark.pipelines`.
"""

from __future__ import annotations

import gc
import sys

from flightstore_spark.source import FlightstoreDataSource

__all__ = ["FlightstoreDataSource", "in_spark_worker", "register"]


def in_spark_worker() -> bool:
    """Whether this process is one of Spark's Python workers (forked by ``pyspark.daemon``, which
    names the worker module in its arguments): task workers and the planners (schema, partitions)."""
    return len(sys.argv) > 1 and sys.argv[0].endswith("daemon.py") and sys.argv[1].startswith("pyspark")


# Spark's daemon runs a full ``gc.collect()`` in a reused worker after every task and every planner
# call. With pyspark, pyarrow and the client imported that walked ~55,000 long-lived objects,
# 30-60 ms each time on a busy 2-core machine: the larger part of a read's Python worker time (py-spy
# on the bench's reads), paid on the query's critical path by the schema and partition planners.
# Frozen, the imports' objects are left out of every later collection (they live as long as the
# worker anyway); only worker processes are touched, never a driver or a user's process.
if in_spark_worker():
    gc.freeze()


def register(spark) -> None:
    """Register the ``flightstore`` format with ``spark`` and enable Python data source filter
    pushdown (``spark.sql.python.filterPushdown.enabled``), which the reader relies on.

    Batch reads then plan at most the session's default parallelism of input partitions (the
    ``partitions`` option overrides it): a Python planner cannot ask Spark, so the registered class
    carries it (a subclass of :class:`FlightstoreDataSource`, pickled by value to the planners)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        cores = int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: one partition per bucket
        cores = None
    source = FlightstoreDataSource
    if cores:
        source = type(f"FlightstoreDataSource{cores}", (FlightstoreDataSource,),
                      {"default_partitions": cores, "__module__": "flightstore_spark._registered",
                       "__doc__": FlightstoreDataSource.__doc__})
    spark.dataSource.register(source)
