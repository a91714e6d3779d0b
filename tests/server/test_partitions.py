"""Partitioned tables end to end over ADBC (Flight SQL): auto-partitioning with retention against a
DuckDB model of the surviving rows, pruning shown by EXPLAIN and the endpoints, partition DDL and
listings, metadata, limits and dynamic creation refused with nothing written."""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.autopartition import partition_value
from flightstore.partitioned import partition_directory
from flightstore.schema import TablePath
from flightstore.server import protocol
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def _noon_zone() -> tuple[str, dt.datetime]:
    """An IANA zone where it is about noon now (``Etc/GMT-N`` is UTC+N), so no day boundary falls
    inside the test, and the current time there."""
    utc = dt.datetime.now(dt.timezone.utc)
    shift = 12 - utc.hour
    name = f"Etc/GMT{'-' if shift > 0 else '+'}{abs(shift)}"
    from zoneinfo import ZoneInfo
    return name, utc.astimezone(ZoneInfo(name))


def _adbc(uri: str):
    return dbapi.connect(uri, autocommit=True)


def _rows(cursor, sql: str) -> list[tuple]:
    cursor.execute(sql)
    table = cursor.fetch_arrow_table()
    return sorted(tuple(row.values()) for row in table.to_pylist())


def test_auto_partitioned_day_table_keeps_seven_days_and_answers_like_duckdb(tmp_path):
    running = RunningServer(tmp_path / "data", options={"auto-partition.check.interval": "100ms"})
    try:
        zone, now = _noon_zone()
        days = [partition_value(now, "DAY", -offset) for offset in range(9, -1, -1)]  # 10 days, oldest first
        model = pa.table({"dt": [d for d in days for _ in range(25)],
                          "id": list(range(250)),
                          "v": [float(i % 17) for i in range(250)]})
        with _adbc(running.uri) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE logins (dt STRING, id BIGINT, v DOUBLE) PARTITIONED BY (dt) WITH ("
                        "'bucket.num' = '2', 'bucket.key' = 'id', 'table.auto-partition.enabled' = 'true', "
                        "'table.auto-partition.time-unit' = 'DAY', 'table.auto-partition.num-retention' = '7', "
                        f"'table.auto-partition.time-zone' = '{zone}')")
            # created at once: today and tomorrow (num-precreate = 2)
            assert _rows(cur, "SHOW PARTITIONS logins") == [(f"dt={days[-1]}",),
                                                             (f"dt={partition_value(now, 'DAY', 1)}",)]
            for day in days:  # one write per day: the past days' partitions are created by the write
                cur.adbc_ingest("logins", model.filter(pa.compute.equal(model["dt"], day)), mode="append")
        store = running.store
        path = TablePath("default", "logins")
        table_dir = store.catalog.table_dir(path)
        expected = days[2:] + [partition_value(now, "DAY", 1)]
        wait_until(lambda: sorted(p.name for p in store.catalog.get_table(path).partitions) == expected,
                   "the check dropping the two days past the retention")
        descriptor = store.catalog.get_table(path)
        kept_ids = {p.id for p in descriptor.partitions}
        # The catalog commits the drop first, then the directories go (a crash in between leaves
        # orphans that the next open removes): wait for that second step too.
        wait_until(lambda: not any(partition_directory(table_dir, i).exists()
                                   for i in range(descriptor.next_partition_id) if i not in kept_ids),
                   "the dropped partitions' directories being deleted")
        assert all(partition_directory(table_dir, i).is_dir() for i in kept_ids)

        surviving = model.filter(pa.compute.is_in(model["dt"], pa.array(days[2:])))  # noqa: F841 - DuckDB reads it
        queries = [
            "SELECT * FROM {t}",
            f"SELECT * FROM {{t}} WHERE dt = '{days[5]}'",
            f"SELECT id, v FROM {{t}} WHERE dt >= '{days[6]}' AND v > 8",
            f"SELECT dt, COUNT(*), SUM(v) FROM {{t}} WHERE dt IN ('{days[3]}', '{days[9]}', '{days[0]}') GROUP BY dt",
            "SELECT dt, COUNT(*) AS n, MAX(v) FROM {t} GROUP BY dt",
            f"SELECT COUNT(*) FROM {{t}} WHERE dt BETWEEN '{days[2]}' AND '{days[4]}'",
            f"SELECT * FROM {{t}} WHERE dt < '{days[2]}'",  # only expired days: nothing
            f"SELECT * FROM {{t}} WHERE dt <> '{days[7]}' AND id % 3 = 0",
        ]
        with _adbc(running.uri) as conn, conn.cursor() as cur:
            for query in queries:
                expected_rows = sorted(duckdb.sql(query.format(t="surviving")).fetchall())
                assert _rows(cur, query.format(t="logins")) == expected_rows, query
            cur.execute(f"EXPLAIN SELECT * FROM logins WHERE dt = '{days[5]}'")
            assert f"partitions=[{days[5]}]" in cur.fetchone()[0]
    finally:
        running.stop()


def test_partition_ddl_listings_metadata_and_endpoints(server):
    with _adbc(server.uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE sales (region STRING, day DATE, id BIGINT, amount DOUBLE, "
                    "PRIMARY KEY (region, day, id) NOT ENFORCED) PARTITIONED BY (region, day) "
                    "WITH ('bucket.num' = '3')")
        cur.execute("ALTER TABLE sales ADD PARTITION (region = 'eu', day = DATE '2026-01-01')")
        cur.execute("ALTER TABLE sales ADD IF NOT EXISTS PARTITION (region = 'eu', day = DATE '2026-01-01')")
        cur.execute("INSERT INTO sales VALUES ('us', DATE '2026-01-02', 1, 5.0), ('eu', DATE '2026-01-01', 2, 7.0)")
        assert _rows(cur, "SHOW PARTITIONS sales") == [("region=eu/day=2026-01-01",),
                                                       ("region=us/day=2026-01-02",)]
        assert _rows(cur, "SELECT partition_name, region, day, num_buckets, row_count FROM `sales$partitions`") == [
            ("eu$2026-01-01", "eu", dt.date(2026, 1, 1), 3, 1), ("us$2026-01-02", "us", dt.date(2026, 1, 2), 3, 1)]
        assert [r[0] for r in _rows(cur, "DESCRIBE sales") if r[4]] == ["day", "region"]
        schema = conn.adbc_get_table_schema("sales", db_schema_filter="default")
        assert schema.metadata[b"flightstore.partition_keys"] == b"region,day"
        assert schema.field("region").metadata[b"ARROW:FLIGHT:SQL:REMARKS"] == b"partition key"
        cur.execute("ALTER TABLE sales DROP PARTITION (region = 'us', day = '2026-01-02')")
        assert _rows(cur, "SELECT id FROM sales") == [(2,)]
        cur.execute("ALTER TABLE sales DROP IF EXISTS PARTITION (region = 'us', day = '2026-01-02')")
        cur.execute("SELECT COUNT(*) FROM sales WHERE region = 'eu'")
        assert cur.fetchone() == (1,)

    # one Flight endpoint per (partition, bucket) of the pruned partitions, on request
    with flightstore.connect(server.uri) as conn:
        conn.sql("INSERT INTO sales VALUES ('us', DATE '2026-01-03', 3, 1.0), ('jp', DATE '2026-01-03', 4, 2.0)")
    client = flight.FlightClient(server.uri)
    try:
        options = flight.FlightCallOptions(timeout=60)
        request = flight.Action(protocol.SET_SESSION_OPTIONS, protocol.SetSessionOptionsRequest(
            session_options={"flightstore.per-bucket-endpoints": protocol.SessionOptionValue(
                bool_value=True)}).SerializeToString())
        list(client.do_action(request, options))

        def endpoints(sql: str) -> int:
            command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
            info = client.get_flight_info(flight.FlightDescriptor.for_command(command), options)
            rows = sum(client.do_get(e.ticket, options).read_all().num_rows for e in info.endpoints)
            return len(info.endpoints), rows

        assert endpoints("SELECT * FROM sales") == (9, 3)
        assert endpoints("SELECT * FROM sales WHERE region = 'us'") == (3, 1)
        assert endpoints("SELECT * FROM sales WHERE region IN ('us', 'jp') AND amount > 0") == (6, 2)
    finally:
        client.close()


def test_partition_limits_and_disabled_dynamic_creation_write_nothing(tmp_path):
    running = RunningServer(tmp_path / "data", options={"max.partition.num": "3",
                                                        "client.writer.dynamic-create-partition.enabled": "true"})
    try:
        with flightstore.connect(running.uri) as conn:
            conn.sql("CREATE TABLE ev (dt STRING, id BIGINT) PARTITIONED BY (dt)")
            conn.sql("INSERT INTO ev VALUES ('a', 1), ('b', 2)")
            with pytest.raises(pa.ArrowInvalid, match="max.partition.num"):
                conn.sql("INSERT INTO ev VALUES ('c', 3), ('d', 4), ('a', 5)")
            with pytest.raises(pa.ArrowInvalid, match="max.partition.num"):
                conn.table("ev").append({"dt": ["e", "f"], "id": [6, 7]})
            assert sorted(conn.sql("SELECT * FROM ev").to_pylist(), key=lambda r: r["id"]) == [
                {"dt": "a", "id": 1}, {"dt": "b", "id": 2}]
            assert conn.sql("SHOW PARTITIONS ev").column(0).to_pylist() == ["dt=a", "dt=b"]
            with pytest.raises(pa.ArrowInvalid, match="(?i)dt.*must not be null"):
                conn.table("ev").append({"dt": ["a", None], "id": [8, 9]})
            with pytest.raises(pa.ArrowInvalid, match="separator"):
                conn.table("ev").append({"dt": ["a", "x$y"], "id": [8, 9]})
            assert conn.sql("SELECT COUNT(*) FROM ev").column(0)[0].as_py() == 2
    finally:
        running.stop()
    running = RunningServer(tmp_path / "data", options={"client.writer.dynamic-create-partition.enabled": "false"})
    try:
        with flightstore.connect(running.uri) as conn:
            with pytest.raises(pa.ArrowKeyError, match="dynamic partition creation is off"):
                conn.sql("INSERT INTO ev VALUES ('a', 10), ('z', 11)")
            conn.sql("INSERT INTO ev VALUES ('a', 12)")
            conn.sql("ALTER TABLE ev ADD PARTITION (dt = 'z')")
            conn.sql("INSERT INTO ev VALUES ('z', 13)")
            assert sorted(conn.sql("SELECT id FROM ev").column(0).to_pylist()) == [1, 2, 12, 13]
    finally:
        running.stop()


def test_auto_partition_check_runs_at_start_up(tmp_path):
    zone, now = _noon_zone()
    running = RunningServer(tmp_path / "data")  # the default interval (10 min): no periodic check here
    try:
        with flightstore.connect(running.uri) as conn:
            conn.sql("CREATE TABLE h (hr STRING, id BIGINT) PARTITIONED BY (hr) WITH ("
                     "'table.auto-partition.enabled' = 'true', 'table.auto-partition.time-unit' = 'HOUR', "
                     f"'table.auto-partition.num-precreate' = '3', 'table.auto-partition.time-zone' = '{zone}')")
            conn.sql("ALTER TABLE h DROP PARTITION (hr = '" + partition_value(now, "HOUR", 2) + "')")
            conn.sql("ALTER TABLE h ADD PARTITION (hr = '2000010100')")  # far past the retention
            conn.sql("ALTER TABLE h SET ('table.auto-partition.num-precreate' = '4')")
    finally:
        running.stop()
    running = RunningServer(tmp_path / "data")
    try:
        expected = [partition_value(now, "HOUR", i) for i in range(4)]
        wait_until(lambda: [p.name for p in sorted(running.store.catalog.get_table(
            TablePath("default", "h")).partitions, key=lambda p: p.name)] == expected,
            "the start-up check creating 4 hours ahead and dropping 2000010100")
    finally:
        running.stop()
