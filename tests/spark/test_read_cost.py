"""What a Spark batch read costs besides its rows: round trips and authentication handshakes at
the server, and input partitions (each a Spark task with a fixed cost). Counted at a real server
(its own call metrics), through a real Spark session."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flightstore_spark.source import FlightstoreDataSource, FlightstoreReader, row_bytes, sized_partitions

from flightstore.client import connect
from flightstore.server.service import FlightSqlServer
from tests.server.conftest import RunningServer

pytestmark = pytest.mark.slow

CREDENTIALS = {"username": "etl", "password": "s3cret"}


@pytest.fixture
def secured(tmp_path):
    """A server in this process (its call counts readable) that authenticates every connection."""
    running = RunningServer(tmp_path / "data", users={"etl": "s3cret"}, super_users=("etl",))
    yield running.server
    running.stop()


def _calls(server: FlightSqlServer) -> dict[str, int]:
    return server.metrics.served()["calls"]


def _since(before: dict[str, int], server: FlightSqlServer) -> dict[str, int]:
    return {method: n - before.get(method, 0) for method, n in _calls(server).items() if n > before.get(method, 0)}


def _load(spark, uri: str, **options):
    reader = spark.read.format("flightstore").option("uri", uri)
    for key, value in {**CREDENTIALS, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def test_workers_and_planners_keep_one_connection_across_partitions_and_queries(spark, secured):
    """Each Python process Spark runs for a read (the schema and partition planners, the task
    workers) authenticates once and reuses its connection for every partition and query after:
    two reads of 8 partitions make at most one handshake per process (local[2]: two planners, two
    task workers), not one per planner call and partition (2 x (2 + 8) = 20)."""
    with connect(secured.uri, **CREDENTIALS, timeout=60) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, v DOUBLE) WITH ('bucket.num' = '8')")
        conn.table("t").append({"id": list(range(800)), "v": [float(i) for i in range(800)]})
    before = _calls(secured)
    for _ in range(2):
        df = _load(spark, secured.uri, table="t", partitions="8")
        assert df.rdd.getNumPartitions() == 8
        assert sorted(r["id"] for r in df.collect()) == list(range(800))
    calls = _since(before, secured)
    assert calls["DoGet"] >= 16  # every partition was read from the server, both times
    assert calls.get("Handshake", 0) <= 4, calls


def test_a_read_is_planned_in_two_round_trips(secured):
    """Planning a table read asks the server where its buckets live and for the read's plan
    (buckets left by the pushed filters, their rows, the lake split): two actions, not one more
    per question."""
    with connect(secured.uri, **CREDENTIALS, timeout=60) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, v DOUBLE) WITH ('bucket.num' = '4')")
        conn.table("t").append({"id": list(range(40)), "v": [0.5] * 40})
    options = {"uri": secured.uri, "table": "t", **CREDENTIALS}
    reader = FlightstoreReader(options, FlightstoreDataSource(options).schema(), 2)
    before = _calls(secured)
    partitions = reader.partitions()
    assert _since(before, secured) == {"DoAction": 2}
    assert sorted(b for p in partitions for b in p.value["payload"]["buckets"]) == [0, 1, 2, 3]


def test_partitions_are_sized_to_the_data_as_well_as_the_cores(spark, secured):
    """Without the ``partitions`` option a read plans no more than one partition per 4 MB of
    estimated data (rows x the read columns' widths), and no more than the cores: a small table is
    one task; the option is kept as given."""
    n = 400_000  # 3 BIGINT columns: 9.6 MB, 3 partitions' worth, on 2 cores; 1 column: 3.2 MB
    with connect(secured.uri, **CREDENTIALS, timeout=60) as conn:
        conn.sql("CREATE TABLE big (a BIGINT, b BIGINT, c BIGINT) WITH ('bucket.num' = '4')")
        column = pa.array(range(n), pa.int64())
        conn.table("big").append(pa.table({"a": column, "b": column, "c": column}))
        conn.sql("CREATE TABLE small (a BIGINT, s STRING) WITH ('bucket.num' = '4')")
        conn.table("small").append({"a": list(range(100)), "s": ["x"] * 100})
    assert _load(spark, secured.uri, table="big").rdd.getNumPartitions() == 2  # the cores
    assert _load(spark, secured.uri, table="big", columns="a").rdd.getNumPartitions() == 1
    assert _load(spark, secured.uri, table="small").rdd.getNumPartitions() == 1
    assert _load(spark, secured.uri, table="small", partitions="3").rdd.getNumPartitions() == 3
    assert _load(spark, secured.uri, table="big", partitions="3").rdd.getNumPartitions() == 3


def test_partitions_share_the_buckets_out_by_rows(spark, secured):
    """A log table's buckets fill round-robin per written message: 10 appends of 20k rows (one
    message each) in 4 buckets are 3, 3, 2 and 2 of them. Read on 2 cores, each task reads 5
    appends' rows (buckets 0 and 2, 1 and 3), not 6 and 4 (contiguous halves: one core idles while
    the other reads the rest)."""
    from pyspark.sql.functions import spark_partition_id

    batch = 20_000  # 200k rows of 3 BIGINT columns: 4.8 MB, two partitions' worth
    with connect(secured.uri, **CREDENTIALS, timeout=60) as conn:
        conn.sql("CREATE TABLE uneven (a BIGINT, b BIGINT, c BIGINT) WITH ('bucket.num' = '4')")
        for i in range(10):
            column = pa.array(range(i * batch, (i + 1) * batch), pa.int64())
            conn.table("uneven").append(pa.table({"a": column, "b": column, "c": column}))
        assert sorted(conn.table("uneven").usage()["end_offsets"].values()) == [2 * batch, 2 * batch,
                                                                               3 * batch, 3 * batch]
    df = _load(spark, secured.uri, table="uneven")
    assert df.rdd.getNumPartitions() == 2
    per_task = df.groupBy(spark_partition_id().alias("p")).count().orderBy("p").collect()
    assert [r["count"] for r in per_task] == [5 * batch, 5 * batch]


def test_group_buckets_by_rows():
    from flightstore_spark.source import group_buckets

    rows = {0: 30, 1: 30, 2: 20, 3: 20}
    assert group_buckets([0, 1, 2, 3], 2, lambda b: None, rows) == [(None, [0, 2]), (None, [1, 3])]
    assert group_buckets([0, 1, 2, 3], 2, lambda b: None, {0: 90, 1: 5, 2: 3, 3: 2}) == [(None, [0]),
                                                                                      (None, [1, 2, 3])]
    assert group_buckets([0, 1, 2], 3, lambda b: None, {}) == [(None, [0]), (None, [1]), (None, [2])]  # none empty
    leader = {0: "a", 1: "b", 2: "a", 3: "b"}.get
    assert group_buckets([0, 1, 2, 3], 2, leader, rows) == [("a", [0, 2]), ("b", [1, 3])]


def test_sized_partitions_rule():
    schema = pa.schema([("a", pa.int64()), ("flag", pa.bool_()), ("s", pa.string())])
    assert row_bytes(schema) == 8 + 1 + 32
    mib4 = 4 * 1024 * 1024
    assert sized_partitions(2, True, {0: 10, 1: 10}, schema) == 1
    assert sized_partitions(8, True, {0: mib4 // 8, 1: mib4 // 8}, pa.schema([("a", pa.int64())])) == 2
    assert sized_partitions(8, True, {0: mib4 // 8 + 1}, pa.schema([("a", pa.int64())])) == 2
    assert sized_partitions(2, True, {0: 0, 1: 0}, schema) == 1
    assert sized_partitions(2, False, {0: 10}, schema) == 2  # the option given: as it is
    assert sized_partitions(None, True, {0: 10}, schema) is None  # no cores known: one per bucket
