"""Union read and the lake in SQL: a plain SELECT on a datalake-enabled log table reads the lake below
each bucket's tiered offset plus the log from there (exactly once, also after TTL deleted tiered
segments); ``t$lake``, ``t$lake$snapshots``, ``t$lake$status`` and time travel."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightstore
from flightstore.errors import LakeUnavailable, NotFound, SqlError, Unsupported
from flightstore.lake import LakeCatalog, lake_snapshots
from flightstore.lake.union import union_split
from flightstore.sql.execute import Executor
from tests.lake.conftest import LakeServer, create_events, events
from tests.lake.test_read import _duckdb_rows, duckdb_python  # noqa: F401 - the fixture is used
from tests.waiting import distinct_millisecond, wait_until

FRESHNESS_S = 2
FAR_FUTURE_MS = int(time.time() * 1000) + 10**10


def _seqs(table: pa.Table) -> list[int]:
    return sorted(table.column("seq").to_pylist())


def _run(executor: Executor, sql: str) -> pa.Table:
    return executor.execute_table(executor.plan(sql))


@pytest.fixture
def sql(store, tierer):
    """SQL on the store with the tierer's lake (what a server's executor has)."""
    executor = Executor(store, tierer.catalog, tierer)
    return lambda text: _run(executor, text)


# ---- the acceptance scenario on a real server ----------------------------------------------------
@pytest.mark.slow
def test_continuous_writes_union_read_exactly_once_and_other_engines_agree(
        data_dir, settings, duckdb_python, tmp_path):  # noqa: F811 - a fixture
    running = LakeServer(data_dir, settings, retention_interval_s=0.2)
    store, server = running.store, running.server
    try:
        with flightstore.connect(server.uri, timeout=60) as conn:
            conn.sql("CREATE TABLE events (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3)) WITH "
                     "('bucket.num' = '3', 'bucket.key' = 'k', 'table.datalake.enabled' = 'true', "
                     f"'table.datalake.freshness' = '{FRESHNESS_S}s', 'table.log.ttl' = '1ms', "
                     "'table.log.segment.bytes' = '4096')")
            client = conn.table("default.events")
            table = store.table("default.events")
            written_at: dict[int, float] = {}
            seen_at: dict[int, float] = {}

            def poll_lake() -> bool:
                now = time.monotonic()
                for seq in conn.sql("SELECT seq FROM events$lake").column("seq").to_pylist():
                    seen_at.setdefault(seq, now)
                return len(seen_at) == len(written_at)

            # Write continuously (bounded) until the lake took several commits and retention
            # deleted tiered segments of every bucket; the union read answers every row exactly
            # once all along, whatever tiering and retention do meanwhile.
            written = 0
            for _ in range(600):
                client.append(events(written, 20))
                now = time.monotonic()
                written_at.update(dict.fromkeys(range(written, written + 20), now))
                written += 20
                assert _seqs(conn.sql("SELECT seq FROM events")) == list(range(written))
                poll_lake()
                if written >= 600 and len(lake_snapshots(server.tierer.catalog, table.descriptor)) >= 2 \
                        and all(log.start_offset > 0 for log in table.logs):
                    break
            else:
                pytest.fail("retention never deleted tiered segments of every bucket")
            # Every row reaches t$lake within freshness + 10 s of its write.
            wait_until(poll_lake, "every row in t$lake", timeout=FRESHNESS_S + 30)
            delays = [seen_at[seq] - written_at[seq] for seq in written_at]
            assert max(delays) <= FRESHNESS_S + 10, max(delays)
            wait_until(lambda: all(log.start_offset > 0 for log in table.logs), "retention to run")
            assert all(table.logs[b].start_offset <= off
                       for b, off in union_split(server.tierer.catalog, table).offsets.items())

            # After TTL: still every row once, through every route over the union.
            client.append(events(written, 7))  # a log tail the lake does not hold yet (most likely)
            written += 7
            everything = list(range(written))
            assert _seqs(conn.sql("SELECT * FROM events")) == everything
            assert conn.sql("SELECT COUNT(*) AS n FROM events").column("n").to_pylist() == [written]
            assert conn.sql("SELECT SUM(seq) AS total, COUNT(DISTINCT seq) AS n FROM events").to_pylist() \
                == [{"total": sum(everything), "n": written}]
            model = events(0, written)
            wanted = model.filter(pc.and_(pc.greater_equal(model["seq"], 100), pc.less(model["k"], 300)))
            assert _seqs(conn.sql("SELECT seq, k FROM events WHERE seq >= 100 AND k < 300")) == \
                _seqs(wanted)
            limited = conn.sql("SELECT seq FROM events LIMIT 50").column("seq").to_pylist()
            assert len(limited) == 50 and len(set(limited)) == 50 and set(limited) <= set(everything)
            across = conn.sql(f"SELECT seq FROM events LIMIT {written - 3}").column("seq").to_pylist()
            assert len(across) == written - 3 and len(set(across)) == written - 3  # the lake, then log tails
            # One Flight endpoint per bucket: each reads its bucket's lake files and log tail.
            executor = server.executor
            plan = executor.plan("SELECT seq, k FROM events")
            by_bucket = [_concat(executor.execute(plan, p)) for p in executor.partitions(plan)]
            assert len(by_bucket) == 3
            assert sorted(s for t in by_bucket for s in t.column("seq").to_pylist()) == everything
            for bucket, rows in enumerate(by_bucket):
                assert set(table.buckets_of(_full_rows(model, rows)).tolist()) == {bucket}

            # pyiceberg (its own catalog) and DuckDB's iceberg_scan see what t$lake holds.
            ours = conn.sql("SELECT seq, k, s, __bucket, __offset FROM events$lake")
            key = [("__bucket", "ascending"), ("__offset", "ascending")]
            ours = ours.sort_by(key)
            from pyiceberg.catalog import load_catalog
            other = load_catalog("flightstore", type="sql", uri=settings.catalog_uri,
                                 warehouse=settings.warehouse)
            lake_table = other.load_table("default.events")
            theirs = lake_table.scan(snapshot_id=lake_table.current_snapshot().snapshot_id).to_arrow()
            assert theirs.select(ours.column_names).sort_by(key).to_pylist() == ours.to_pylist()
            # The server may commit again meanwhile: compare DuckDB with t$lake at one snapshot.
            snapshot = lake_table.current_snapshot().snapshot_id
            at_snapshot = conn.sql(f"SELECT seq, k, s, __bucket, __offset FROM events$lake "
                                   f"FOR SYSTEM_TIME AS OF {snapshot}").sort_by(key)
            rows = _duckdb_rows(duckdb_python, tmp_path, lake_table.metadata_location)
            assert rows == [list(r.values()) for r in at_snapshot.to_pylist()]
    finally:
        running.stop()


def _concat(batches) -> pa.Table:
    tables = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches]
    return pa.concat_tables(tables)


def _full_rows(model: pa.Table, rows: pa.Table) -> pa.Table:
    """The rows of ``model`` whose seq is in ``rows`` (for bucketing by the table's columns)."""
    return model.filter(pc.is_in(model["seq"], rows["seq"]))


# ---- union read (embedded: a store, its tierer's lake, the SQL executor) -------------------------
def test_union_read_after_retention_deleted_tiered_segments(store, tierer, sql):
    table = create_events(store, table_log_ttl="1ms", table_log_segment_bytes=4096)
    for first in range(0, 600, 100):
        table.append(events(first, 100))
    tierer.tier_now(table.path)
    table.append(events(600, 50))  # only in the log
    assert store.enforce_retention(FAR_FUTURE_MS) > 0
    assert all(log.start_offset > 0 for log in table.logs)
    # The log alone has lost rows; the union has all, once.
    assert len(_seqs(table.scan_table(["seq"]))) < 650
    assert _seqs(sql("SELECT seq FROM events")) == list(range(650))
    assert sql("SELECT COUNT(*) AS n FROM events").column("n").to_pylist() == [650]
    assert sql("SELECT COUNT(*) AS n FROM events WHERE seq >= 0").column("n").to_pylist() == [650]
    # Partial aggregates read the union too (lake part, then the log tail, streamed).
    grouped = "SELECT seq % 3 AS r, COUNT(*) AS n, SUM(seq) AS total FROM events GROUP BY seq % 3 ORDER BY r"
    assert "partial=" in sql("EXPLAIN " + grouped).column("plan")[0].as_py()
    assert sql(grouped).to_pylist() == [
        {"r": r, "n": len(range(r, 650, 3)), "total": sum(range(r, 650, 3))} for r in range(3)]
    # Filters and pruning on both parts: a bucket-key equality, a range straddling the split.
    model = events(0, 650)
    key = 7 * 123 % 1000
    assert _seqs(sql(f"SELECT seq FROM events WHERE k = {key}")) == \
        _seqs(model.filter(pc.equal(model["k"], key)))
    got = sql("SELECT s, seq FROM events WHERE seq BETWEEN 550 AND 620")
    assert got.column_names == ["s", "seq"] and got.schema.field("s").type == pa.string()
    assert _seqs(got) == list(range(550, 621))
    assert sorted(sql("SELECT ts FROM events WHERE seq < 3").column("ts").to_pylist()) == \
        events(0, 3).column("ts").to_pylist()


def test_union_of_a_table_never_tiered_and_of_one_fully_tiered(store, tierer, sql):
    table = create_events(store)
    assert sql("SELECT seq FROM events").num_rows == 0
    table.append(events(0, 40))
    assert _seqs(sql("SELECT seq FROM events")) == list(range(40))  # nothing in the lake yet
    tierer.tier_now(table.path)
    split = union_split(tierer.catalog, table)
    assert split.offsets == table.end_offsets() and split.lake_rows == 40
    assert _seqs(sql("SELECT seq FROM events")) == list(range(40))  # everything from the lake


def test_a_commit_between_planning_and_reading_changes_nothing(store, tierer):
    """The split is one snapshot: rows committed to the lake after it are read from the log."""
    from flightstore.lake.union import read_union
    table = create_events(store)
    table.append(events(0, 100))
    tierer.tier_now(table.path)
    table.append(events(100, 100))
    split = union_split(tierer.catalog, table)
    tierer.tier_now(table.path)  # the lake now holds all 200 rows
    rows = _concat(read_union(tierer.catalog, table, ["seq"], split=split))
    assert _seqs(rows) == list(range(200))


def test_a_split_whose_log_part_retention_deleted_fails_rather_than_skips(store, tierer):
    """Retention may delete the log part of a split planned on an older snapshot (the floor moved
    with a newer commit): the read refuses (DataLoss: plan again), never skips those rows; a split
    planned now is whole."""
    from flightstore.errors import DataLoss
    from flightstore.lake.union import read_union
    table = create_events(store, table_log_ttl="1ms", table_log_segment_bytes=4096)
    for first in range(0, 300, 50):
        table.append(events(first, 50))
    tierer.tier_now(table.path)
    old = union_split(tierer.catalog, table)
    for first in range(300, 600, 50):
        table.append(events(first, 50))
    tierer.tier_now(table.path)
    assert store.enforce_retention(FAR_FUTURE_MS) > 0
    assert any(log.start_offset > old.offsets[b] for b, log in enumerate(table.logs))
    with pytest.raises(DataLoss, match="plan the read again"):
        list(read_union(tierer.catalog, table, ["seq"], split=old))
    assert _seqs(_concat(read_union(tierer.catalog, table, ["seq"]))) == list(range(600))


def test_lake_unavailable_falls_back_to_a_complete_log_only(store, data_dir, tierer, sql):
    table = create_events(store, table_log_ttl="1ms", table_log_segment_bytes=4096)
    for first in range(0, 300, 50):
        table.append(events(first, 50))
    tierer.tier_now(table.path)
    catalog_file = data_dir / "lake" / "catalog.db"
    catalog_file.rename(catalog_file.with_name("catalog.away"))
    catalog_file.mkdir()  # sqlite cannot open a directory: the catalog is unreachable
    tierer.catalog.reset()
    try:
        # Nothing deleted from the log yet: it answers alone, complete.
        assert _seqs(sql("SELECT seq FROM events")) == list(range(300))
        # Once retention deleted tiered segments, only the lake has those rows: a clear error,
        # never a short answer.
        assert store.enforce_retention(FAR_FUTURE_MS) > 0
        with pytest.raises(LakeUnavailable, match="the rows below are only in the lake"):
            sql("SELECT seq FROM events")
    finally:
        catalog_file.rmdir()
        catalog_file.with_name("catalog.away").rename(catalog_file)
        tierer.catalog.reset()
    assert _seqs(sql("SELECT seq FROM events")) == list(range(300))


def test_explain_shows_the_lake_and_the_log_parts(store, tierer, sql):
    table = create_events(store)
    line, lake, log = sql("EXPLAIN SELECT seq FROM events WHERE k = 5").column("plan").to_pylist()
    assert line.startswith("UnionScan(table=default.events, columns=[seq], filter=k = 5")
    assert "lake=IcebergScan(snapshot=current, rows=below tiered offsets, columns=[seq], row_filter=k = 5)" in line
    assert "log=LogScan(from=tiered offsets, columns=[seq], filter=k = 5)" in line
    assert lake == "lake: none (nothing tiered yet)"
    assert log == "log: bucket 0 offsets [0, 0), bucket 1 offsets [0, 0), bucket 2 offsets [0, 0)"
    table.append(events(0, 300))
    tierer.tier_now(table.path)
    table.append(events(300, 30))
    ends = table.end_offsets()
    tiered = lake_snapshots(tierer.catalog, table.descriptor)[-1]
    _, lake, log = sql("EXPLAIN SELECT seq FROM events WHERE k = 5").column("plan").to_pylist()
    # k = 5 hashes to one bucket: one of the three data files is left after partition pruning.
    assert lake.startswith(f"lake: snapshot {tiered.snapshot_id}, 1 data file(s) after pruning"), lake
    assert log == "log: " + ", ".join(f"bucket {b} offsets [{tiered.offsets[b]}, {ends[b]})" for b in range(3))


# ---- t$lake, t$lake$snapshots, t$lake$status, time travel ----------------------------------------
def test_lake_views_and_time_travel_in_sql(store, tierer, sql):
    table = create_events(store)
    moments = []
    for first, count in ((0, 100), (100, 100), (250, 5)):
        table.append(events(first, count))
        tierer.tier_now(table.path)
        moments.append(distinct_millisecond())
    table.append(events(300, 9))  # untiered
    commits = lake_snapshots(tierer.catalog, table.descriptor)
    expected = [list(range(100)), list(range(200)), list(range(200)) + list(range(250, 255))]

    lake = sql("SELECT * FROM events$lake")
    assert lake.column_names == ["k", "seq", "s", "ts", "__bucket", "__offset", "__timestamp"]
    assert _seqs(lake) == expected[-1]
    assert _seqs(sql("SELECT seq FROM events$lake WHERE seq >= 150")) == list(range(150, 200)) + \
        list(range(250, 255))
    assert sql("SELECT COUNT(*) AS n FROM events$lake").column("n").to_pylist() == [205]

    snapshots = sql("SELECT * FROM events$lake$snapshots")
    assert snapshots.column("snapshot_id").to_pylist() == [c.snapshot_id for c in commits]
    assert snapshots.column("added_rows").to_pylist() == [100, 100, 5]
    assert snapshots.column("total_rows").to_pylist() == [100, 200, 205]
    assert [sum(v for _, v in offsets) for offsets in snapshots.column("offsets").to_pylist()] == \
        [100, 200, 205]
    committed = [int(t.timestamp() * 1000) for t in snapshots.column("committed_at").to_pylist()]
    assert committed == [c.timestamp_ms for c in commits]

    for commit, moment, rows in zip(commits, moments, expected):
        assert _seqs(sql(f"SELECT seq FROM events$lake FOR SYSTEM_TIME AS OF {commit.snapshot_id}")) == rows
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(moment // 1000)) + f".{moment % 1000:03d}"
        assert _seqs(sql(f"SELECT seq FROM events$lake FOR SYSTEM_TIME AS OF TIMESTAMP '{stamp}'")) == rows
        # Residual queries travel too.
        assert sql(f"SELECT MAX(seq) AS m FROM events$lake FOR SYSTEM_TIME AS OF {commit.snapshot_id} AS l "
                   "WHERE l.seq < 1000").column("m").to_pylist() == [max(rows)]

    status = sql("SELECT * FROM events$lake$status ORDER BY bucket")
    assert status.column("bucket").to_pylist() == [0, 1, 2]
    assert status.column("tiered_offset").to_pylist() == [commits[-1].offsets[b] for b in range(3)]
    assert status.column("log_end_offset").to_pylist() == list(table.end_offsets().values())
    assert sum(status.column("lag_records").to_pylist()) == 9
    assert set(status.column("last_snapshot_id").to_pylist()) == {commits[-1].snapshot_id}
    assert status.column("last_error").to_pylist() == [None] * 3
    # Without a tierer in this process, the status comes from the lake.
    reader = Executor(store, LakeCatalog(tierer.settings))
    from_lake = _run(reader, "SELECT bucket, tiered_offset, lag_records FROM events$lake$status ORDER BY bucket")
    assert from_lake.to_pylist() == status.select(["bucket", "tiered_offset", "lag_records"]).to_pylist()


def test_lake_view_errors(store, tierer, sql):
    table = create_events(store)
    store.create_table("default.plain", events(0, 1).schema)
    table.append(events(0, 10))
    tierer.tier_now(table.path)
    first = lake_snapshots(tierer.catalog, table.descriptor)[0]
    with pytest.raises(NotFound, match="has no snapshot 42"):
        sql("SELECT * FROM events$lake FOR SYSTEM_TIME AS OF 42")
    with pytest.raises(NotFound, match="no snapshot at or before"):
        sql("SELECT * FROM events$lake FOR SYSTEM_TIME AS OF TIMESTAMP '2001-01-01 00:00:00'")
    assert first.timestamp_ms > 0
    with pytest.raises(SqlError, match="not datalake-enabled"):
        sql("SELECT * FROM plain$lake")
    with pytest.raises(SqlError, match="not datalake-enabled"):
        sql("SELECT * FROM plain$lake$snapshots")
    with pytest.raises(SqlError, match="query events\\$lake"):
        sql("SELECT * FROM events FOR SYSTEM_TIME AS OF 1")
    with pytest.raises(SqlError, match="unknown column"):
        sql("SELECT nope FROM events$lake")
    # A process without a lake (an embedded store): the union is the log; $lake is refused.
    bare = Executor(store)
    assert _seqs(_run(bare, "SELECT seq FROM events")) == list(range(10))
    with pytest.raises(Unsupported, match="has no lake"):
        _run(bare, "SELECT * FROM events$lake")


def test_lake_views_over_flight(data_dir, settings):
    """Through a real server: the views answer, errors map to Flight statuses."""
    running = LakeServer(data_dir, settings)
    store, server = running.store, running.server
    try:
        table = create_events(store, table_datalake_freshness="1h")
        table.append(events(0, 30))
        server.tierer.tier_now(table.path)
        with flightstore.connect(server.uri, timeout=60) as conn:
            assert _seqs(conn.sql("SELECT seq FROM events$lake")) == list(range(30))
            snapshots = conn.sql("SELECT * FROM events$lake$snapshots")
            assert snapshots.column("added_rows").to_pylist() == [30]
            assert [dict(o) for o in snapshots.column("offsets").to_pylist()] == [table.end_offsets()]
            assert conn.sql("SELECT * FROM events$lake$status").num_rows == 3
            assert conn.sql("SELECT SUM(lag_records) AS lag FROM events$lake$status").column(0).to_pylist() == [0]
            with pytest.raises(pa.ArrowKeyError, match="has no snapshot 7"):  # NOT_FOUND
                conn.sql("SELECT * FROM events$lake FOR SYSTEM_TIME AS OF 7")
            with pytest.raises(pa.ArrowInvalid, match="is not a timestamp"):  # INVALID_ARGUMENT
                conn.sql("SELECT * FROM events$lake FOR SYSTEM_TIME AS OF TIMESTAMP 'soon'")
    finally:
        running.stop()


def test_the_lake_part_is_pruned_by_partition_and_statistics(store, tierer):
    """What a union read with a filter opens of the lake: a bucket-key equality one bucket's file,
    a range beyond every file's statistics none (the log part still answers its rows)."""
    from flightstore.expressions import Comparison
    from flightstore.lake.union import plan_split, read_union
    table = create_events(store)
    table.append(events(0, 300))
    tierer.tier_now(table.path)
    table.append(events(300, 30))
    assert len(plan_split(tierer.catalog, table)["files"]) == 3
    key = 7 * 123 % 1000
    assert len(plan_split(tierer.catalog, table, Comparison("k", "=", key))["files"]) == 1
    beyond = Comparison("seq", ">=", 300)
    assert plan_split(tierer.catalog, table, beyond)["files"] == []
    rows = _concat(read_union(tierer.catalog, table, ["seq"], filter=beyond.bind(table.schema)))
    assert _seqs(rows) == list(range(300, 330))
    planned = plan_split(tierer.catalog, table)
    assert planned["offsets"] == {str(b): o for b, o in union_split(tierer.catalog, table).offsets.items()}
    # Readers elsewhere get the lake's file-IO properties, never its credentials.
    from flightstore.lake.union import public_io_properties
    s3 = {"s3.endpoint": "http://minio:9000", "s3.region": "r", "s3.access-key-id": "AK",
          "s3.secret-access-key": "SK", "s3.session-token": "T", "warehouse": "s3://b/lake"}
    assert public_io_properties(s3) == {"s3.endpoint": "http://minio:9000", "s3.region": "r",
                                        "warehouse": "s3://b/lake"}
