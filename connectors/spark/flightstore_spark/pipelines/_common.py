"""What the pipelines share: Arrow helpers (fold a changelog to its last change per key, match rows by
key without a join engine; no Acero, so buffers straight off the wire are fine), the trigger option,
and the command line's common arguments and Spark session."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    """A Spark session with the flightstore data source registered."""
    from pyspark.sql import SparkSession

    import flightstore_spark

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
    codes = np.stack([pc.dictionary_encode(table.column(c).combine_chunks()).indices.to_numpy(
        zero_copy_only=False).astype(np.int64) for c in key], axis=1)
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    last = np.full(inverse.max() + 1 if len(inverse) else 0, -1, dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(len(inverse), dtype=np.int64))
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
    codes = []
    for column in key:
        both = pa.chunked_array(probe.column(column).chunks + build.column(column).cast(
            probe.schema.field(column).type).chunks)
        codes.append(pc.dictionary_encode(both.combine_chunks()).indices.to_numpy(
            zero_copy_only=False).astype(np.int64))
    _, group = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    probe_groups, build_groups = group[:probe.num_rows], group[probe.num_rows:]
    position = np.full(group.max() + 1, -1, dtype=np.int64)
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
