"""The connector on a datalake-enabled log table: batch reads are lake splits (data files read by
executors straight from the warehouse) plus one log-tail split per bucket and equal the SQL union
read; a stream from ``earliest`` reads the lake first, then the log from the aligned offsets."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from flightstore_spark.source import FlightstoreReader

from flightstore.client import connect
from flightstore.lake import LakeSettings
from tests.lake.conftest import LakeServer, create_events, events

pytestmark = pytest.mark.slow


@pytest.fixture
def lake_server(tmp_path):
    running = LakeServer(tmp_path / "data", LakeSettings.from_options(tmp_path / "data", {}))
    yield running
    running.stop()


def _tiered_table(lake_server):
    """600 rows tiered, the tiered segments deleted by retention, then 40 rows in the log only."""
    table = create_events(lake_server.store, table_datalake_freshness="1h", table_log_ttl="1ms",
                          table_log_segment_bytes=4096)
    # The first round now, while the table is empty: a new table is due at once, and the server's
    # tierer would otherwise be free to tier the rows below in two rounds (two files per bucket);
    # after this one its next round is a freshness interval (1 h) away.
    lake_server.server.tierer.tier_now(table.path)
    for first in range(0, 600, 100):
        table.append(events(first, 100))
    lake_server.server.tierer.tier_now(table.path)
    assert lake_server.store.enforce_retention(int(time.time() * 1000) + 10**10) > 0
    assert all(log.start_offset > 0 for log in table.logs)
    table.append(events(600, 40))
    return table


def _sorted(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


def test_batch_read_is_lake_splits_plus_log_tails_and_equals_sql(spark, lake_server):
    _tiered_table(lake_server)
    conn = connect(lake_server.uri)
    df = spark.read.format("flightstore").option("uri", lake_server.uri).option("table", "default.events").load()
    reader = FlightstoreReader({"uri": lake_server.uri, "table": "default.events"}, df.schema)
    parts = [p.value for p in reader.partitions()]
    lake_parts = [p for p in parts if "lake" in p]
    log_parts = [p for p in parts if "payload" in p]
    assert len(lake_parts) == 3  # one data file per bucket: the lake splits
    assert sorted(p["payload"]["buckets"][0] for p in log_parts) == [0, 1, 2]  # a tail per bucket
    assert all(p["lake"]["files"][0]["path"].startswith("file://") for p in lake_parts)
    assert all(p["lake"]["files"][0]["crc32"] is not None for p in lake_parts)  # executors check it
    assert df.rdd.getNumPartitions() == 6
    got = df.select("k", "seq", "s").toArrow()
    assert sorted(got.column("seq").to_pylist()) == list(range(640))  # every row once
    assert _sorted(got) == _sorted(conn.sql("SELECT k, seq, s FROM events"))
    # A pushed filter prunes lake files (bucket key equality: one bucket's file) and filters rows.
    key = 7 * 123 % 1000
    filtered = spark.read.format("flightstore").option("uri", lake_server.uri) \
        .option("table", "default.events").load().filter(f"k = {key}")
    assert _sorted(filtered.toArrow()) == _sorted(conn.sql(f"SELECT * FROM events WHERE k = {key}"))
    pruned = FlightstoreReader({"uri": lake_server.uri, "table": "default.events"}, df.schema)
    from flightstore.expressions import Comparison
    pruned.pushed = Comparison("k", "=", key)
    assert len([p for p in pruned.partitions() if "lake" in p.value]) == 1
    # snapshot.id: the lake snapshot alone, its 3 files in at most `partitions` tasks, each checked
    from flightstore_spark import _flight
    snapshot_id = _flight.lake_split(conn, "default.events", lake_only=True)["snapshot_id"]
    alone = spark.read.format("flightstore").option("uri", lake_server.uri).option("table", "default.events") \
        .option("snapshot.id", str(snapshot_id)).option("partitions", "2").load()
    assert alone.rdd.getNumPartitions() == 2
    assert sorted(alone.select("seq").toArrow().column("seq").to_pylist()) == list(range(600))
    conn.close()


def test_stream_from_earliest_reads_the_lake_then_the_log(spark, lake_server, tmp_path):
    _tiered_table(lake_server)
    seen: list = []

    def collect(df, batch_id):
        seen.append((batch_id, [r.asDict() for r in df.collect()]))

    def run():
        query = (spark.readStream.format("flightstore").option("uri", lake_server.uri)
                 .option("table", "default.events").option("startup.mode", "earliest").load()
                 .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run()
    rows = [r for _, batch in seen for r in batch]
    assert sorted(r["seq"] for r in rows) == list(range(640))  # the expired rows came from the lake
    assert {r["_change_type"] for r in rows} == {"+A"}
    for bucket_key in {r["k"] for r in rows}:
        offsets = [r["_log_offset"] for r in rows if r["k"] == bucket_key]
        assert len(offsets) == len(set(offsets))
    # New rows continue from the log after a restart from the checkpoint.
    lake_server.store.table("default.events").append(events(640, 10))
    run()
    rows = [r for _, batch in seen for r in batch]
    assert sorted(r["seq"] for r in rows) == list(range(650))


def test_stream_max_rows_per_trigger_splits_the_lake_part_and_resumes_after_a_restart(spark, lake_server, tmp_path):
    """maxRowsPerTrigger holds in the lake part too: data files, and row ranges of a file larger
    than the limit, spread over micro-batches; a query that dies in one resumes from its checkpoint
    at the same positions (the replayed micro-batch reads the same rows) and every row comes once."""
    from flightstore_spark import _flight
    from pyspark.errors import StreamingQueryException

    limit = 150
    _tiered_table(lake_server)
    with connect(lake_server.uri) as conn:
        files = _flight.lake_split(conn, "default.events")["files"]
    assert len(files) == 3 and max(f["rows"] for f in files) > limit  # several files, one larger than the limit
    committed: dict[int, list[dict]] = {}
    attempts: dict[int, list[list[int]]] = {}
    fail_in = {2}

    def collect(df, batch_id):
        rows = [r.asDict() for r in df.collect()]
        attempts.setdefault(batch_id, []).append(sorted(r["seq"] for r in rows))
        if batch_id in fail_in:
            fail_in.discard(batch_id)
            raise RuntimeError("injected: the query dies in this micro-batch")
        committed[batch_id] = rows

    def run():
        query = (spark.readStream.format("flightstore").option("uri", lake_server.uri)
                 .option("table", "default.events").option("startup.mode", "earliest")
                 .option("maxRowsPerTrigger", str(limit)).load()
                 .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        except StreamingQueryException:
            pass
        return query.exception()

    assert run() is not None  # died in micro-batch 2, mid-lake
    assert sorted(committed) == [0, 1]
    assert run() is None  # restarted from the checkpoint
    assert len(attempts[2]) == 2 and attempts[2][0] == attempts[2][1]  # the same rows on replay
    sizes = [len(committed[b]) for b in sorted(committed)]
    assert sorted(committed) == list(range(len(sizes)))
    assert len(sizes) >= 5 and max(sizes) <= limit, sizes  # 640 rows, none above the limit
    rows = [r for b in sorted(committed) for r in committed[b]]
    assert sorted(r["seq"] for r in rows) == list(range(640))  # every row exactly once
    assert sum(sizes[:4]) == 600 and sizes[4] <= limit  # the lake's 600 rows first, then the log


def test_lake_positions_advance_by_rows_over_files_and_ranges_cover_each_row_once():
    from flightstore_spark.stream import lake_advance, lake_ranges

    files = [("a", 5), ("b", 0), ("c", 12), ("d", 3)]
    at, seen = None, []
    while True:
        stop = lake_advance(files, at, 4)
        ranges = lake_ranges(files, at, stop)
        assert sum(last - first for _, first, last in ranges) == (4 if stop is not None else 20 - len(seen))
        seen += [(path, row) for path, first, last in ranges for row in range(first, last)]
        if stop is None:
            break
        at = stop
    assert seen == [(path, row) for path, rows in files for row in range(rows)]  # in order, once each
    assert lake_advance(files, ("a", 0), 5) == ("c", 0)  # a budget ending at a file's end
    assert lake_advance(files, ("c", 10), 5) is None
    # A file that vanished from the plan (its partition dropped) leaves later positions valid.
    assert lake_ranges([("a", 5), ("d", 3)], ("c", 7), None) == [("d", 0, 3)]
