"""PySpark connector for flightstore (Python Data Source API, format ``flightstore``).

    import flightstore_spark
    flightstore_spark.register(spark)
    df = spark.read.format("flightstore").option("uri", uri).option("table", "db.t").load()

See :mod:`flightstore_spark.source` (batch reads), :mod:`flightstore_spark.stream` (changelog
streaming reads) and :mod:`flightstore_spark.writer` (batch and streaming writes), and the pipelines
in :mod:`flightstore_spark.pipelines`.
"""

from __future__ import annotations

from flightstore_spark.source import FlightstoreDataSource
from flightstore_spark.workers import freeze_imports, in_spark_worker

__all__ = ["FlightstoreDataSource", "in_spark_worker", "register"]


# Spark's daemon runs a full gc.collect() in a worker after every task and planner call: the
# connector's imports (pyspark, pyarrow, flightstore: ~55,000 objects) are frozen there at once,
# and what a read imports later at the end of the reader's calls (flightstore_spark.workers).
freeze_imports()


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
