"""What the pipelines share: Arrow helpers (fold a changelog to its last change per key, match rows by
key without a join engine; no Acero, so buffers straight off the wire are fine), the trigger option,
and the command line's common arguments and Spark session."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from flightstore_spark.keys import key_groups

__all__ = ["distinct_keys", "fold_last", "match_rows", "query_identity", "with_trigger", "pipeline_parser",
           "local_spark"]


def with_trigger(writer, trigger: str):
    """``trigger`` is ``availableNow`` (process what is there, then stop) or seconds between batches."""
    if trigger == "availableNow":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{float(trigger)} seconds")


def pipeline_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """A pipeline's argument parser with the options every pipeline takes."""
    parser = argparse.ArgumentParser(prog=f"python -m flightstore_spark.pipelines.{module}",
                                     description=doc.split("\n\n")[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger", default="availableNow", help="availableNow or seconds between batches")
    parser.add_argument("--master", default="local[*]")
    return parser


def local_spark(master: str, app: str):
    """A Spark session with the flightstore data source registered (its Python workers import pip's
    pyspark compiled, unless SPARK_HOME names a Spark installation: :mod:`flightstore_spark.spark_home`)."""
    from pyspark.sql import SparkSession

    import flightstore_spark
    from flightstore_spark.spark_home import use_compiled_pyspark

    use_compiled_pyspark()  # pip's pyspark: workers import it compiled, not from pyspark.zip
    builder = SparkSession.builder.master(master).appName(app)
    if master.startswith("local"):  # a shard (shuffle partition) per core, not Spark's 200 tiny tasks
        cores = master[len("local"):].strip("[]")
        cores = str(os.cpu_count() or 2) if cores in ("", "*") else cores.split(",")[0]
        builder = builder.config("spark.sql.shuffle.partitions", cores)
    spark = (builder
             .config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s")  # busy machines: 15 s is short
             .getOrCreate())
    flightstore_spark.register(spark)
    return spark


def last_positions(table: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Row positions of the last row of each distinct ``key`` in ``table``, in table order."""
    if table.num_rows == 0:
        return np.empty(0, dtype=np.int64)
    group = key_groups(table, key)
    last = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last, group, np.arange(len(group), dtype=np.int64))
    return np.sort(last)


def fold_last(changes: pa.Table, key: Sequence[str]) -> pa.Table:
    """The last change of every key (input in change order), in input order."""
    if changes.num_rows == 0:
        return changes
    return changes.take(pa.array(last_positions(changes, key)))


def distinct_keys(table: pa.Table, key: Sequence[str]) -> pa.Table:
    return fold_last(table.select(list(key)), key)


def match_rows(probe: pa.Table, build: pa.Table, key: Sequence[str]) -> pa.Array:
    """For every row of ``probe``, the position of the row of ``build`` with the same ``key``
    (``build`` is unique on ``key``), null where there is none."""
    if probe.num_rows == 0:
        return pa.array([], pa.int64())
    both = pa.table({column: pa.chunked_array(probe.column(column).chunks + build.column(column).cast(
        probe.schema.field(column).type).chunks, probe.schema.field(column).type) for column in key})
    group = key_groups(both, key)
    probe_groups, build_groups = group[:probe.num_rows], group[probe.num_rows:]
    position = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    position[build_groups] = np.arange(len(build_groups), dtype=np.int64)
    found = position[probe_groups]
    return pa.array(found, mask=found < 0)


def query_identity(spark, fallback: str) -> str:
    """The running streaming query's id (stable across restarts from a checkpoint), seen from a
    foreachBatch function; ``fallback`` when Spark does not expose it."""
    try:
        value = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # noqa: BLE001
        value = None
    return value or fallback
