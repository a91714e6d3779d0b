"""ALTER TABLE ADD COLUMN end to end: a primary-key table (data in its log, KV and KV snapshots)
and a log table get a column with no rewrite; after a restart (the KVs rebuilt from their
pre-ALTER snapshots plus the log after them) every route (point and prefix lookups, scans with
filters, residual SQL, $changelog, $binlog, subscriptions, the Python client) returns NULL in it for
the old rows and the values of the new ones. Writers that did not refresh still write (NULL); a
subscription running through the ALTER keeps its columns, a new one sees the new column."""

from __future__ import annotations

import shutil
import threading

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.catalog import read_table_dir
from flightstore.expressions import IsNull
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def _q(conn, sql: str) -> list[dict]:
    return conn.sql(sql).to_pylist()


def test_add_column_reads_null_for_old_rows_through_every_route_after_restart(tmp_path):
    server = RunningServer(tmp_path / "data")
    subscription_rows: list = []
    try:
        with flightstore.connect(server.uri, timeout=120) as conn:
            conn.sql("CREATE TABLE kv (shop BIGINT, id BIGINT, qty INT, PRIMARY KEY (shop, id) NOT ENFORCED) "
                     "WITH ('bucket.num' = '2', 'bucket.key' = 'shop')")
            conn.sql("CREATE TABLE lg (id BIGINT, qty INT) WITH ('bucket.num' = '2')")
            conn.sql("INSERT INTO kv VALUES (1, 1, 10), (1, 2, 20), (2, 3, 30)")
            conn.sql("INSERT INTO kv VALUES (1, 2, 21)")  # an update: -U/+U in the changelog
            conn.sql("INSERT INTO lg VALUES (1, 10), (2, 20)")
            conn.table("kv").upsert({"shop": [3], "id": [4], "qty": [40]})
            snapshots = conn.table("kv").snapshot(force=True)  # KV snapshots (checkpoint + image) of v1
            assert all(info is not None for info in snapshots.values())

            watcher = flightstore.connect(server.uri, timeout=120)  # stays open through the ALTER
            before = watcher.table("lg").subscribe("earliest", columns=["id", "qty", "_change_type"])
            def follow() -> None:
                try:
                    for batch in before:
                        subscription_rows.extend(batch.to_pylist())
                except flight.FlightCancelledError:
                    pass  # closed at the end of the test

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            wait_until(lambda: len(subscription_rows) >= 2, "the running subscription reading the old rows")

        with dbapi.connect(server.uri, autocommit=True) as adbc, adbc.cursor() as cur:
            cur.execute("ALTER TABLE kv ADD COLUMN note STRING COMMENT 'free text', ADD (price DOUBLE)")
            cur.execute("ALTER TABLE lg ADD COLUMN note STRING")
            cur.execute("INSERT INTO kv VALUES (2, 5, 50, 'five', 5.5)")
            cur.execute("INSERT INTO kv (shop, id, note) VALUES (1, 1, 'partial')")  # updates an old row
            cur.execute("INSERT INTO lg VALUES (3, 30, 'three')")
        with flightstore.connect(server.uri, timeout=120) as conn:
            # A writer that did not refresh sends rows of the old schema: NULL in the new columns.
            conn.table("kv").upsert({"shop": [3], "id": [6], "qty": [60]})
            conn.table("lg").append({"id": [4], "qty": [40]})
        wait_until(lambda: len(subscription_rows) >= 4, "the running subscription reading new rows")
        assert all(set(r) == {"id", "qty", "_change_type"} for r in subscription_rows)  # its columns held
        assert sorted(r["id"] for r in subscription_rows) == [1, 2, 3, 4]
        before.close()
        follower.join(timeout=60)
        watcher.close()
    finally:
        server.stop()

    kv_dirs = list(read_table_dir(tmp_path / "data", "kv").glob("bucket-*/kv"))
    assert len(kv_dirs) == 2
    for kv_dir in kv_dirs:  # the KVs are rebuilt from their version-1 snapshots plus the log after
        shutil.rmtree(kv_dir)
    server = RunningServer(tmp_path / "data")  # restart: logs, snapshots and catalog read back
    try:
        assert [kv.recovered_from.split()[0] for kv in server.store.table("default.kv").kvs] == [
            "snapshot", "snapshot"]
        with flightstore.connect(server.uri, timeout=120) as conn:
            kv_rows = {(1, 1): (10, "partial", None), (1, 2): (21, None, None), (2, 3): (30, None, None),
                       (3, 4): (40, None, None), (2, 5): (50, "five", 5.5), (3, 6): (60, None, None)}
            scan = _q(conn, "SELECT * FROM kv")
            assert {(r["shop"], r["id"]): (r["qty"], r["note"], r["price"]) for r in scan} == kv_rows
            assert _q(conn, "SELECT note, price FROM kv WHERE shop = 1 AND id = 2") == [{"note": None, "price": None}]
            assert _q(conn, "SELECT id, note FROM kv WHERE shop = 2 AND id IN (3, 5)") == [
                {"id": 3, "note": None}, {"id": 5, "note": "five"}]
            assert "PrefixLookup" in _q(conn, "EXPLAIN SELECT id, note FROM kv WHERE shop = 1")[0]["plan"]
            assert sorted((r["id"], r["note"]) for r in _q(conn, "SELECT id, note FROM kv WHERE shop = 1")) == [
                (1, "partial"), (2, None)]
            assert sorted(r["id"] for r in _q(conn, "SELECT id FROM kv WHERE note IS NULL")) == [2, 3, 4, 6]
            assert sorted(r["id"] for r in _q(conn, "SELECT id FROM kv WHERE price > 1")) == [5]
            residual = _q(conn, "SELECT note IS NULL AS missing, COUNT(*) AS n, SUM(qty) AS q FROM kv GROUP BY 1")
            assert sorted((r["missing"], r["n"], r["q"]) for r in residual) == [(False, 2, 60), (True, 4, 151)]
            lookups = conn.table("kv").lookup({"shop": [3, 1], "id": [4, 1]}, ["note", "qty"])
            assert lookups.to_pylist() == [{"note": None, "qty": 40}, {"note": "partial", "qty": 10}]
            client_scan = conn.table("kv").scan(["id", "price"], filter=IsNull("price"))
            assert sorted(client_scan.column("id").to_pylist()) == [1, 2, 3, 4, 6]

            changelog = _q(conn, "SELECT id, qty, note, _change_type FROM `kv$changelog`")
            assert ({"id": 2, "qty": 20, "note": None, "_change_type": "-U"} in changelog
                    and {"id": 1, "qty": 10, "note": "partial", "_change_type": "+U"} in changelog
                    and {"id": 5, "qty": 50, "note": "five", "_change_type": "+I"} in changelog)
            binlog = [r for r in _q(conn, "SELECT * FROM `kv$binlog`") if r["after"]["id"] == 1]
            assert [(b["before"] and b["before"]["note"], b["after"]["note"]) for b in binlog] == [
                (None, None), (None, "partial")]

            lg = _q(conn, "SELECT id, qty, note FROM lg")
            assert sorted((r["id"], r["note"]) for r in lg) == [(1, None), (2, None), (3, "three"), (4, None)]
            ends = conn.table("lg").offsets("end")
            fresh = [r for b in conn.table("lg").subscribe("earliest", until=ends) for r in b.to_pylist()]
            assert sorted((r["id"], r["note"]) for r in fresh) == [(1, None), (2, None), (3, "three"), (4, None)]
            assert conn.sql("DESCRIBE kv").column("name").to_pylist() == ["shop", "id", "qty", "note", "price"]
            assert _q(conn, "SELECT COUNT(*) AS n FROM kv") == [{"n": 6}]
            kv = conn.table("kv")
            image_rows = [r for b, end in kv.offsets("end").items()  # snapshot image + changelog tail
                          for r in kv.read_snapshot(b, end, ["shop", "id", "note", "price"]).to_pylist()]
            assert {(r["shop"], r["id"]): (r["note"], r["price"]) for r in image_rows} == {
                k: v[1:] for k, v in kv_rows.items()}
        with dbapi.connect(server.uri, autocommit=True) as adbc, adbc.cursor() as cur:
            cur.execute("SELECT shop, id, note FROM kv WHERE shop = 3 AND id = 6")
            assert cur.fetchall() == [(3, 6, None)]
            schema = adbc.adbc_get_table_schema("kv", db_schema_filter="default")
            assert schema.names == ["shop", "id", "qty", "note", "price"] and schema.field("price").nullable
            assert schema.field("note").metadata[b"ARROW:FLIGHT:SQL:REMARKS"] == b"free text"
    finally:
        server.stop()


def test_widening_a_column_converts_old_rows_on_read(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE w (id BIGINT, n SMALLINT, f FLOAT, PRIMARY KEY (id) NOT ENFORCED)")
        conn.sql("INSERT INTO w VALUES (1, 7, 1.5)")
        conn.sql("ALTER TABLE w MODIFY n BIGINT, MODIFY f DOUBLE")
        conn.sql("INSERT INTO w VALUES (2, 9000000000, 2.25)")
        rows = conn.sql("SELECT * FROM w")
        assert rows.schema.field("n").type == pa.int64() and rows.schema.field("f").type == pa.float64()
        assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "n": 7, "f": 1.5}, {"id": 2, "n": 9_000_000_000, "f": 2.25}]
        assert conn.sql("SELECT n FROM w WHERE id = 1").to_pylist() == [{"n": 7}]
