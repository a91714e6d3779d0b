"""Batch reads through the connector equal the server's SQL answers."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from flightstore_spark.source import FlightstoreReader
from pyspark.sql import datasource as ds

from flightstore.client import connect

pytestmark = pytest.mark.slow


@pytest.fixture
def tables(server):
    conn = connect(server.uri)
    conn.sql("CREATE DATABASE db")
    conn.sql("CREATE TABLE db.lg (id BIGINT, name STRING, score DOUBLE, day DATE, "
             "ts TIMESTAMP(3) WITH LOCAL TIME ZONE) WITH ('bucket.num' = '3')")
    conn.sql("CREATE TABLE db.kv (k BIGINT, v BIGINT, s STRING, PRIMARY KEY (k) NOT ENFORCED) "
             "WITH ('bucket.num' = '2')")
    n = 300
    conn.table("db.lg").append(pa.table({
        "id": pa.array(range(n), pa.int64()),
        "name": [None if i % 7 == 0 else f"n{i % 13}" for i in range(n)],
        "score": [i / 3 for i in range(n)],
        "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % 30) for i in range(n)],
        "ts": pa.array([1_700_000_000_000 + i for i in range(n)], pa.timestamp("ms", tz="UTC"))}))
    kv = conn.table("db.kv")
    kv.upsert({"k": list(range(100)), "v": [i * 10 for i in range(100)], "s": [f"s{i % 5}" for i in range(100)]})
    kv.upsert({"k": [5, 6], "v": [-5, -6], "s": ["x", None]})
    kv.delete({"k": [7, 8]})
    yield conn
    conn.close()


def _rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def _spark_rows(df) -> list[tuple]:
    return _rows(df.toArrow())


def _load(spark, server, **options):
    reader = spark.read.format("flightstore").option("uri", server.uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_equals_sql_with_columns_filters_and_partitions(spark, server, tables):
    conn = tables
    for table, buckets in (("db.lg", 3), ("db.kv", 2)):
        df = _load(spark, server, table=table)
        # partitions sized to the data and the cores: a few kB is one task (the bound by the
        # session's default parallelism, 2, on a larger table: test_read_cost)
        assert df.rdd.getNumPartitions() == 1
        assert _spark_rows(df) == _rows(conn.sql(f"SELECT * FROM {table}"))
        per_bucket = _load(spark, server, table=table, partitions=str(buckets + 5))
        assert per_bucket.rdd.getNumPartitions() == buckets
        assert _spark_rows(per_bucket) == _rows(conn.sql(f"SELECT * FROM {table}"))
    one = _load(spark, server, table="db.lg", partitions="1")
    assert one.rdd.getNumPartitions() == 1
    assert _spark_rows(one) == _rows(conn.sql("SELECT * FROM db.lg"))
    lg = _load(spark, server, table="db.lg")
    assert _spark_rows(lg.filter("id > 297")) == _rows(conn.sql("SELECT * FROM db.lg WHERE id > 297"))
    # Spark reuses a DataFrame's read planned with pushed filters for a later action that pushes
    # none; a fresh DataFrame per query avoids it (documented on FlightstoreReader)
    lg = _load(spark, server, table="db.lg")
    filtered = lg.filter("id >= 10 AND id < 200 AND name LIKE 'n1%' AND score <= 60 AND name IS NOT NULL")
    assert _spark_rows(filtered.select("id", "name")) == _rows(conn.sql(
        "SELECT id, name FROM db.lg WHERE id >= 10 AND id < 200 AND name LIKE 'n1%' AND score <= 60"))
    assert _spark_rows(lg.filter("name IS NULL").select("id")) == _rows(
        conn.sql("SELECT id FROM db.lg WHERE name IS NULL"))
    lg = _load(spark, server, table="db.lg")
    assert _spark_rows(lg.filter("id IN (1, 2, 300) OR id = 5").select("id")) == [(1,), (2,), (5,)]
    assert _spark_rows(lg.filter("NOT (id IN (1, 2)) AND id < 4").select("id")) == [(0,), (3,)]
    assert _spark_rows(lg.filter("day = DATE'2024-01-02' AND name LIKE '%3'").select("id")) == _rows(
        conn.sql("SELECT id FROM db.lg WHERE day = DATE '2024-01-02' AND name LIKE '%3'"))
    pruned = _load(spark, server, table="db.lg", columns="name,id")
    assert pruned.columns == ["name", "id"]
    assert _spark_rows(pruned.filter("id > 250")) == _rows(conn.sql("SELECT name, id FROM db.lg WHERE id > 250"))
    kv = _load(spark, server, table="db.kv", columns="k,s")
    assert _spark_rows(kv.filter("s = 's1' OR k = 5")) == _rows(
        conn.sql("SELECT k, s FROM db.kv WHERE s = 's1' OR k = 5"))
    kv = _load(spark, server, table="db.kv", columns="k,s")
    assert _spark_rows(kv.filter("k = 6")) == [(6, None)]
    unpushed = _load(spark, server, table="db.lg", pushFilters="false")
    assert _spark_rows(unpushed.filter("id < 2").select("id")) == [(0,), (1,)]
    assert unpushed.count() == 300


def test_partitions_group_contiguous_buckets_per_leader_and_bad_values_fail():
    from flightstore_spark.source import group_buckets, most_partitions

    assert group_buckets([0, 1, 2, 3], 2, lambda b: None) == [(None, [0, 1]), (None, [2, 3])]
    assert group_buckets([0, 1, 2], 2, lambda b: None) == [(None, [0, 1]), (None, [2])]
    assert group_buckets([0, 1, 2], None, lambda b: None) == [(None, [0]), (None, [1]), (None, [2])]
    assert group_buckets([4, 5], 8, lambda b: None) == [(None, [4]), (None, [5])]
    # a cluster: a group never mixes leaders; more leaders than partitions: one group per leader
    leader = {0: "a", 1: "b", 2: "a", 3: "b", 4: "c"}.get
    assert group_buckets([0, 1, 2, 3, 4], 2, leader) == [("a", [0, 2]), ("b", [1, 3]), ("c", [4])]
    assert group_buckets([0, 1, 2, 3], 4, leader) == [("a", [0]), ("a", [2]), ("b", [1]), ("b", [3])]
    assert most_partitions(None, 2) == 2 and most_partitions("3", 2) == 3 and most_partitions(None, None) is None
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="partitions"):
            most_partitions(bad, 2)


def test_lake_snapshot_files_are_shared_out_by_rows_in_at_most_the_partitions_asked():
    from flightstore_spark.source import group_files

    files = [{"path": p, "rows": r} for p, r in (("a", 10), ("b", 70), ("c", 20), ("d", 40), ("e", 5))]
    groups = group_files(files, 2)
    assert len(groups) == 2 and sorted(f["path"] for g in groups for f in g) == ["a", "b", "c", "d", "e"]
    assert sorted(sum(f["rows"] for f in g) for g in groups) == [70, 75]  # shared out by rows
    assert [[f["path"] for f in g] for g in group_files(files[:2], 8)] == [["b"], ["a"]]
    assert len(group_files(files, None)) == 5 and group_files([], 2) == []


def test_pushed_query_and_filter_translation(spark, server, tables):
    point = _load(spark, server, query="SELECT k, v FROM db.kv WHERE k = 42")
    assert point.rdd.getNumPartitions() == 1 and _spark_rows(point) == [(42, 420)]
    limited = _load(spark, server, query="SELECT id FROM db.lg LIMIT 7")
    assert limited.count() == 7
    # a pushed scan asks for one endpoint per bucket (a session option): one partition each
    scan = _load(spark, server, query="SELECT k FROM db.kv WHERE v >= 0")
    assert scan.rdd.getNumPartitions() == 2
    assert sorted(r[0] for r in _spark_rows(scan)) == [k for k in range(100) if k not in (5, 6, 7, 8)]

    schema = _load(spark, server, table="db.lg").schema
    reader = FlightstoreReader({"uri": server.uri, "table": "db.lg"}, schema)
    filters = [ds.GreaterThan(("id",), 3), ds.StringEndsWith(("name",), "x"), ds.In(("name",), ("n1", None)),
               ds.Not(ds.EqualTo(("score",), 1.0)), ds.IsNull(("day",)), ds.StringStartsWith(("name",), "n"),
               ds.LessThanOrEqual(("ts",), dt.datetime(2024, 1, 1)), ds.EqualTo(("nested", "x"), 1)]
    kept = list(reader.pushFilters(filters))
    assert kept == [filters[1], filters[6], filters[7]]
    pushed = reader.pushed.to_dict()
    assert "starts_with" in str(pushed) and "is_null" in str(pushed) and "not" in str(pushed)
    partitions = reader.partitions()
    assert len(partitions) == 3
    assert [p.value["payload"]["buckets"] for p in partitions] == [[0], [1], [2]]
    assert all(p.value["payload"]["filter"] == pushed for p in partitions)


def test_column_pruning_hook_is_detected_and_narrows_the_read(server, tables):
    """PySpark 4.3 has no pruning hook for Python data sources (the ``columns`` option is the way);
    a PySpark whose DataSourceReader has ``pruneColumns`` (SPARK-51713) is detected, and the
    connector's hook then reads only the required columns."""
    from flightstore_spark.source import FlightstoreDataSource, prunes_columns
    from pyspark.sql.datasource import DataSourceReader
    from pyspark.sql.types import LongType, StructField, StructType

    assert prunes_columns() == hasattr(DataSourceReader, "pruneColumns")

    class FuturePySparkReader(DataSourceReader):
        def pruneColumns(self, requiredSchema):  # noqa: N802, N803
            return requiredSchema

    assert prunes_columns(FuturePySparkReader) and not prunes_columns(object)
    source = FlightstoreDataSource({"uri": server.uri, "table": "db.lg"})
    reader = FlightstoreReader({"uri": server.uri, "table": "db.lg"}, source.schema())
    required = StructType([StructField("id", LongType())])
    assert reader.pruneColumns(required).fieldNames() == ["id"]
    (partition, *_) = reader.partitions()
    assert partition.value["payload"]["columns"] == ["id"]
    batches = list(reader.read(partition))
    assert batches and all(b.schema.names == ["id"] for b in batches)


def test_spark_workers_leave_the_imports_out_of_sparks_per_task_gc(spark):
    """Spark's daemon runs gc.collect() in a worker after every task and planner call: the
    connector freezes the objects of its imports there (they live as long as the worker), and
    only there (this driver process is left alone)."""
    import gc

    import flightstore_spark

    assert not flightstore_spark.in_spark_worker() and gc.get_freeze_count() == 0

    def probe(batches):
        import gc

        import flightstore_spark  # noqa: F401 - what a read's unpickled reader imports
        for _ in batches:
            yield pa.record_batch({"frozen": [gc.get_freeze_count()]})

    (row,) = spark.range(1, numPartitions=1).mapInArrow(probe, "frozen long").collect()
    assert row["frozen"] > 10_000


def test_a_spark_worker_freezes_what_it_imported_after_the_connector(spark, server, tables):
    """What a worker imports after the connector (in the bench's read workers pandas and dateutil,
    ~27,700 objects) was walked again by Spark's gc.collect() after every task, 11-16 ms CPU each: a
    worker that planned and read a table has it frozen too, a few thousand objects at most left."""
    uri = server.uri

    def probe(batches):
        import gc
        import importlib
        import sys

        from flightstore_spark.source import FlightstoreDataSource, FlightstoreReader

        importlib.import_module("pandas")  # after the connector, as in the bench's workers
        for _ in batches:
            options = {"uri": uri, "table": "db.lg"}
            reader = FlightstoreReader(options, FlightstoreDataSource(options).schema(), 2)
            rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
            gc.collect()
            yield pa.record_batch({"rows": [rows], "pandas": ["pandas" in sys.modules],
                                   "unfrozen": [len(gc.get_objects())]})

    (row,) = spark.range(1, numPartitions=1).mapInArrow(probe, "rows long, pandas boolean, unfrozen long").collect()
    assert row["rows"] == 300 and row["pandas"]
    assert row["unfrozen"] < 5_000, row


def test_not_null_columns_reach_spark_non_nullable_and_a_null_there_fails(spark, server, tables):
    """A table scan keeps the server's NOT NULL (primary-key and NOT NULL columns): Spark then
    skips the null test of each of their values in its row conversion. The rows still equal SQL's,
    nulls of nullable columns included; a changelog read keeps every column nullable; a null
    that would reach a non-nullable column fails the read instead of reaching Spark as a value."""
    from flightstore_spark.source import conform_batches
    from pyspark.sql.types import LongType, StructField, StructType

    conn = tables
    conn.sql("CREATE TABLE db.nn (k BIGINT, v BIGINT NOT NULL, s STRING, PRIMARY KEY (k) NOT ENFORCED) "
             "WITH ('bucket.num' = '2')")
    conn.table("db.nn").upsert({"k": [1, 2, 3], "v": [10, 20, 30], "s": ["a", None, "c"]})
    df = _load(spark, server, table="db.nn")
    assert [(f.name, f.nullable) for f in df.schema.fields] == [("k", False), ("v", False), ("s", True)]
    assert _spark_rows(df) == _rows(conn.sql("SELECT k, v, s FROM db.nn"))
    narrowed = _load(spark, server, table="db.nn", columns="s,v")
    assert [(f.name, f.nullable) for f in narrowed.schema.fields] == [("s", True), ("v", False)]
    assert sorted(r["v"] for r in narrowed.collect()) == [10, 20, 30]
    changelog = _load(spark, server, table="db.nn", changelog="true")
    assert all(f.nullable for f in changelog.schema.fields)

    required = StructType([StructField("v", LongType(), False)])
    with pytest.raises(ValueError, match="'v'"):  # a nullable batch with a null, cast
        list(conform_batches(iter([pa.record_batch({"v": [1, None]})]), required))
    declared = pa.schema([pa.field("v", pa.int64(), nullable=False)])
    with pytest.raises(ValueError, match="'v' is NOT NULL"):  # a batch that claims NOT NULL but holds one
        list(conform_batches(iter([pa.RecordBatch.from_arrays([pa.array([1, None])], schema=declared)]),
                             required))
    assert list(conform_batches(iter([pa.record_batch({"v": [1, 2]})]), required))[0].schema == declared


def test_a_partition_reaches_spark_in_few_large_batches_equal_to_the_servers(server, tables):
    """Spark pays per batch a Python data source yields, and the server cuts its messages at
    2 MB: a partition's batches are concatenated up to the read batch limits (order and rows kept;
    a limit is never exceeded by joining, a larger batch passes alone)."""
    from flightstore_spark.source import FlightstoreDataSource, coalesce_batches

    conn = tables
    conn.sql("CREATE TABLE db.big (id BIGINT, pad STRING) WITH ('bucket.num' = '1')")
    n = 3_000
    pad = "x" * 1_000  # 3,000 rows of ~1 kB: more than one 2 MB server message
    conn.table("db.big").append(pa.table({"id": pa.array(range(n), pa.int64()), "pad": [pad] * n}))
    assert len(list(conn.table("db.big").scan_batches())) > 1  # what the server sends
    options = {"uri": server.uri, "table": "db.big"}
    reader = FlightstoreReader(options, FlightstoreDataSource(options).schema())
    (partition,) = reader.partitions()
    (batch,) = list(reader.read(partition))
    assert batch.column("id").to_pylist() == list(range(n))

    parts = [pa.record_batch({"v": list(range(i, i + 3))}) for i in range(0, 12, 3)]  # 4 batches of 3 rows
    joined = list(coalesce_batches(iter(parts), max_rows=7))
    assert [b.num_rows for b in joined] == [6, 6]
    assert [v for b in joined for v in b.column("v").to_pylist()] == list(range(12))
    assert [b.num_rows for b in coalesce_batches(iter(parts), max_bytes=parts[0].nbytes * 2)] == [6, 6]
    assert [b.num_rows for b in coalesce_batches(iter(parts), max_rows=2)] == [3, 3, 3, 3]  # larger: alone
    assert list(coalesce_batches(iter([]))) == []
