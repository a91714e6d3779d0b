"""Aggregation in storage equals Spark's own streaming groupBy: each micro-batch combined in Spark
(one row per key, no Spark state), no double counting when a micro-batch is replayed."""

from __future__ import annotations

import os

import pytest
from flightstore_spark.pipelines import aggregation

from flightstore.client import connect

TIMEOUT = pytest.mark.timeout(900)  # streaming queries on a busy machine
COLUMNS = ["user_id", "clicks", "amount"]


def _tables(conn, amount_agg: str = "sum") -> None:
    conn.sql("CREATE TABLE clicks (user_id BIGINT, clicks BIGINT, amount DOUBLE) WITH ('bucket.num' = '2')")
    conn.sql("CREATE TABLE per_user (user_id BIGINT, clicks BIGINT, amount DOUBLE, "
             "PRIMARY KEY (user_id) NOT ENFORCED) WITH ('bucket.num' = '2', "
             "'table.merge-engine' = 'aggregation', 'fields.clicks.agg' = 'sum', "
             f"'fields.amount.agg' = '{amount_agg}')")


def _append(conn, round_: int) -> None:
    """40 events of 5 keys, each key in both buckets (two appends: one per bucket, round robin)."""
    for half in (range(20), range(20, 40)):
        conn.table("clicks").append({"user_id": [u % 5 for u in half], "clicks": [1] * 20,
                                     "amount": [float(u + round_) for u in half]})


def _run(spark, server, checkpoint: str):
    query = aggregation.start(spark, server.uri, "clicks", "per_user", COLUMNS, checkpoint)
    query.awaitTermination()
    assert query.exception() is None
    assert not [op for p in query.recentProgress for op in p["stateOperators"]], "the job kept Spark state"
    return query


def _rows(conn) -> list[tuple]:
    return sorted(tuple(r.values()) for r in conn.sql("SELECT * FROM per_user").to_pylist())


@pytest.mark.slow
@TIMEOUT
def test_aggregation_table_equals_spark_groupby(spark, server, tmp_path):
    conn = connect(server.uri)
    _tables(conn)
    for round_ in range(2):
        _append(conn, round_)
        _run(spark, server, str(tmp_path / "agg"))
        if round_ == 0:  # combined in Spark: one +I per key (a fold per task (bucket) wrote 15 changes)
            assert all(conn.table("clicks").offsets("end").values())
            assert sum(conn.table("per_user").offsets("end").values()) == 5
    aggregation.spark_groupby(spark, server.uri, "clicks", ["user_id"], ["clicks", "amount"],
                              str(tmp_path / "spark"), "spark_agg")
    theirs = sorted(tuple(r) for r in spark.sql("SELECT user_id, clicks, amount FROM spark_agg").collect())
    ours = _rows(conn)
    assert ours == theirs and len(ours) == 5 and sum(r[1] for r in ours) == 80


@pytest.mark.slow
@TIMEOUT
def test_replayed_micro_batch_is_not_counted_twice(spark, server, tmp_path):
    """A micro-batch whose commit was lost runs again from the checkpoint's offsets: its shards are
    sent again under the same writer ids (the query id, the batch id and the shard), and dropped."""
    conn = connect(server.uri)
    _tables(conn)
    _append(conn, 0)
    checkpoint = str(tmp_path / "agg")
    query = _run(spark, server, checkpoint)
    first, end = _rows(conn), conn.table("per_user").offsets("end")
    assert sum(r[1] for r in first) == 40
    sequences = [conn._action("flightstore.writer", {"table": "per_user", "writer_id": f"spark-agg-{query.id}-0-{s}"})
                 ["sequence"] for s in range(2)]
    assert sequences == [0, 0], sequences  # a shard per bucket, named by the query id (not the run's)
    commits = os.path.join(checkpoint, "commits")
    for name in ("0", ".0.crc"):
        if os.path.exists(os.path.join(commits, name)):
            os.remove(os.path.join(commits, name))
    _run(spark, server, checkpoint)
    assert os.path.exists(os.path.join(commits, "0")), "the forgotten micro-batch was not run again"
    assert _rows(conn) == first and conn.table("per_user").offsets("end") == end
    _append(conn, 1)  # the next micro-batch still counts
    _run(spark, server, checkpoint)
    assert sum(r[1] for r in _rows(conn)) == 80


@pytest.mark.slow
@TIMEOUT
def test_order_sensitive_floating_max_is_written_event_by_event(spark, server, tmp_path):
    """Spark's max orders NaN above every number, the table's skips it: a DOUBLE max is not
    combined in Spark but written through the streaming writer, and its NaN is skipped."""
    conn = connect(server.uri)
    _tables(conn, amount_agg="max")
    conn.table("clicks").append({"user_id": [1, 1, 2], "clicks": [1, 1, 1], "amount": [float("nan"), 3.0, 2.0]})
    assert aggregation.Combine.resolve(server.uri, "per_user", COLUMNS) is None
    _run(spark, server, str(tmp_path / "agg"))
    assert _rows(conn) == [(1, 2, 3.0), (2, 1, 2.0)]


def test_what_is_combined_in_spark(server):
    conn = connect(server.uri)
    _tables(conn)
    combine = aggregation.Combine.resolve(server.uri, "per_user", COLUMNS)
    assert combine is not None and combine.key == ("user_id",) and combine.shards == 2
    assert combine.functions == (("clicks", "sum"), ("amount", "sum"))
    assert aggregation.Combine.resolve(server.uri, "per_user", ["clicks", "amount"]) is None  # no key
    conn.sql("CREATE TABLE latest (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH "
             "('table.merge-engine' = 'aggregation', 'fields.v.agg' = 'last_value')")
    assert aggregation.Combine.resolve(server.uri, "latest", ["k", "v"]) is None  # order matters
    conn.sql("CREATE TABLE peak (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH "
             "('table.merge-engine' = 'aggregation', 'fields.v.agg' = 'max')")
    assert aggregation.Combine.resolve(server.uri, "peak", ["k", "v"]) is not None  # integers: no NaN
    assert aggregation.Combine.resolve(server.uri, "clicks", COLUMNS) is None  # a log table
