"""Spark over partitioned tables: one input partition per (partition, bucket), partitions pruned
from pushed filters, and streams that cover every partition, including ones created while they run,
and keep working through ALTER TABLE ADD COLUMN."""

from __future__ import annotations

import pytest
from flightstore_spark.source import FlightstoreReader
from pyspark.sql.datasource import EqualTo, GreaterThan, In

from flightstore.client import connect
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _load(spark, server, table, **options):
    reader = spark.read.format("flightstore").option("uri", server.uri).option("table", table)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_has_one_input_partition_per_partition_bucket_and_prunes(spark, server):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE pk (dt STRING, id BIGINT, v DOUBLE, PRIMARY KEY (dt, id) NOT ENFORCED) "
             "PARTITIONED BY (dt) WITH ('bucket.num' = '2')")
    days = ["2026-01-01", "2026-01-02", "2026-01-03"]
    conn.table("pk").upsert({"dt": [d for d in days for _ in range(10)], "id": list(range(30)),
                             "v": [float(i) for i in range(30)]})
    df = _load(spark, server, "default.pk", partitions="16")
    assert df.rdd.getNumPartitions() == 6
    assert sorted(tuple(r) for r in df.collect()) == sorted(
        (days[i // 10], i, float(i)) for i in range(30))

    reader = FlightstoreReader({"uri": server.uri, "table": "default.pk"}, df.schema)
    kept = list(reader.pushFilters([EqualTo(("dt",), "2026-01-02"), GreaterThan(("v",), 12.0)]))
    assert kept == []
    partitions = reader.partitions()
    buckets = [p.value["payload"]["buckets"][0] for p in partitions]
    assert len(buckets) == 2  # the two buckets of the one matching partition
    assert {b // 2 for b in buckets} == {1}  # partition ids: 2026-01-01 is 0, 2026-01-02 is 1
    rows = [row for p in partitions for batch in reader.read(p) for row in batch.to_pylist()]
    assert sorted(r["id"] for r in rows) == list(range(13, 20))

    reader = FlightstoreReader({"uri": server.uri, "table": "default.pk"}, df.schema)
    list(reader.pushFilters([In(("dt",), ("2026-01-01", "2026-01-03", "1999-01-01"))]))
    assert len(reader.partitions()) == 4
    pruned = (_load(spark, server, "default.pk", partitions="16").filter("dt >= '2026-01-02' AND v < 25"))
    assert pruned.rdd.getNumPartitions() == 4
    sized = _load(spark, server, "default.pk")  # sized to the data: 30 rows are one group of buckets
    assert sized.rdd.getNumPartitions() == 1
    assert sorted(r["id"] for r in sized.filter("dt >= '2026-01-02'").collect()) == list(range(10, 30))
    assert sorted(r["id"] for r in pruned.collect()) == list(range(10, 25))


def test_stream_covers_new_partitions_and_survives_add_column(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE ev (dt STRING, k BIGINT) PARTITIONED BY (dt) WITH ('bucket.num' = '2', "
             "'bucket.key' = 'k')")
    events = conn.table("ev")
    events.append({"dt": ["d1"] * 4, "k": [1, 2, 3, 4]})
    seen: list = []
    query = (spark.readStream.format("flightstore").option("uri", server.uri).option("table", "default.ev")
             .option("startup.mode", "earliest").load()
             .writeStream.foreachBatch(lambda df, _: seen.extend(tuple(r) for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        wait_until(lambda: len(seen) >= 4, "the stream reading partition d1")
        events.append({"dt": ["d2"] * 3, "k": [5, 6, 7]})  # a partition created while the stream runs
        wait_until(lambda: len(seen) >= 7, "the stream reading the new partition d2")
        conn.sql("ALTER TABLE ev ADD COLUMN note STRING")
        conn.table("ev").append({"dt": ["d3", "d1"], "k": [8, 9], "note": ["a", "b"]})
        wait_until(lambda: len(seen) >= 9, "the stream reading rows written after ADD COLUMN")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted((r[0], r[1], r[2]) for r in seen) == sorted(
        [("d1", k, "+A") for k in (1, 2, 3, 4, 9)] + [("d2", k, "+A") for k in (5, 6, 7)] + [("d3", 8, "+A")])
    assert all(len(r) == 5 for r in seen)  # dt, k and the three changelog columns: its schema held

    scanned = _load(spark, server, "default.ev")  # a batch read after the ALTER: NULL in old rows
    assert sorted((r["dt"], r["k"], r["note"]) for r in scanned.collect()) == sorted(
        [("d1", k, None) for k in (1, 2, 3, 4)] + [("d2", k, None) for k in (5, 6, 7)]
        + [("d3", 8, "a"), ("d1", 9, "b")])
    changelog = _load(spark, server, "default.ev", changelog="true")
    assert "note" in changelog.columns
    rows = sorted((r["dt"], r["k"], r["note"]) for r in changelog.collect())
    assert rows == sorted([("d1", k, None) for k in (1, 2, 3, 4)] + [("d2", k, None) for k in (5, 6, 7)]
                          + [("d3", 8, "a"), ("d1", 9, "b")])
