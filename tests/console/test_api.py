"""The console's JSON API against a real server: every number equals what SQL and the Flight
actions answer for the same thing; each user sees only what DESCRIBE allows; login sessions and
HTTP Basic both admit, a wrong password does not; cancel stops a running query."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.lake import LakeCatalog
from flightstore.schema import TablePath
from flightstore.server import protocol
from tests.console.conftest import ALICE_TABLES, ALL_TABLES, PASSWORDS, ConsoleServer
from tests.waiting import wait_until


def _listed(body: dict) -> set[str]:
    return {f"{t['database']}.{t['name']}" for db in body["databases"] for t in db["tables"]}


@pytest.mark.parametrize("name", sorted(ALL_TABLES))
def test_table_page_numbers_equal_the_sql_answers(console, name):
    admin = console.http("admin")
    with console.connect() as conn:
        client = conn.table(name)
        page = admin.ok(f"/api/table?name={name}")
        buckets = {b["bucket"]: b for b in page["bucket_list"]}
        assert page["row_count"] == conn.sql(f"SELECT COUNT(*) AS n FROM {name}").column("n")[0].as_py()
        assert {b: v["log_start"] for b, v in buckets.items()} == client.offsets("start")
        assert {b: v["log_end"] for b, v in buckets.items()} == client.offsets("end")
        assert sum(b["log_end"] for b in buckets.values()) > 0
        usage = client.usage()
        assert sum(b["bytes"] for b in buckets.values()) == usage["bytes"]["total"]
        described = conn.sql(f"DESCRIBE {name}").to_pylist()
        assert [(c["name"], c["type"]) for c in page["columns"]] == [(r["name"], r["type"]) for r in described]
        assert page["schema_version"] == len(page["schema_versions"]) == (2 if name == "default.events" else 1)
        listed = {t["name"]: t for db in admin.ok("/api/tables")["databases"] for t in db["tables"]}
        summary = listed[TablePath.parse(name).table]
        assert summary["buckets"] == page["buckets"] == (len(buckets) // max(page["partitions"], 1))
        if name == "default.accounts":  # the KV snapshot a snapshot action reports
            snapshots = client.snapshot()
            assert {b: v["kv_snapshot_offset"] for b, v in buckets.items()} == \
                {b: (s["offset"] if s else None) for b, s in snapshots.items()}
            assert any(b["kv_snapshot_offset"] for b in buckets.values())
        if name == "default.daily":
            partitions = conn.sql("SELECT partition_name, row_count FROM default.`daily$partitions`").to_pylist()
            assert [(p["name"], p["row_count"]) for p in page["partition_list"]] == \
                [(p["partition_name"], p["row_count"]) for p in partitions]
            assert summary["partitions"] == len(partitions) == 2
            assert len(buckets) == 2 * page["buckets"]
        if name == "default.lakey":
            status = conn.sql("SELECT bucket, tiered_offset, lag_records FROM default.`lakey$lake$status`").to_pylist()
            assert {b: (v["lake_tiered_offset"], v["lake_lag_records"]) for b, v in buckets.items()} == \
                {s["bucket"]: (s["tiered_offset"], s["lag_records"]) for s in status}


def _equals_sql(conn, page: dict) -> None:
    """A primary-key table's page against COUNT(*) and the Flight actions."""
    client = conn.table(page["name"])
    buckets = {b["bucket"]: b for b in page["bucket_list"]}
    assert page["row_count"] == conn.sql(f"SELECT COUNT(*) AS n FROM {page['name']}").column("n")[0].as_py()
    assert {b: v["log_start"] for b, v in buckets.items()} == client.offsets("start")
    assert {b: v["log_end"] for b, v in buckets.items()} == client.offsets("end")
    assert sum(b["bytes"] for b in buckets.values()) == client.usage()["bytes"]["total"]


def test_a_primary_key_table_not_opened_since_a_restart(tmp_path):
    """The page of a primary-key table the server has not opened since it started answers from
    each KV's read-only look (RocksDB stays closed) the numbers SQL answers, and the page it
    showed before the restart; a write then opens RocksDB and the page follows it."""
    running = ConsoleServer(tmp_path / "data")
    try:
        with running.connect() as conn:
            conn.sql("CREATE TABLE pk (id BIGINT, name STRING, PRIMARY KEY (id)) WITH ('bucket.num' = '4')")
            ids = pa.array(range(30), pa.int64())
            conn.table("pk").upsert(pa.table({"id": ids, "name": [f"n{i}" for i in range(30)]}))
            conn.table("pk").upsert(pa.table({"id": ids.slice(0, 6), "name": ["again"] * 6}))
            conn.table("pk").snapshot()
            conn.table("pk").delete(pa.table({"id": ids.slice(20, 5)}))  # after the snapshot
        before = running.http("admin").ok("/api/table?name=default.pk")
    finally:
        running.stop()
    running = ConsoleServer(tmp_path / "data")
    try:
        admin = running.http("admin")
        page = admin.ok("/api/table?name=default.pk")
        kvs = running.server.store.local_table("default.pk").kvs
        with running.connect() as conn:
            assert page["row_count"] == 25 and any(b["kv_snapshot_offset"] for b in page["bucket_list"])
            assert [{k: v for k, v in b.items() if k != "bytes"} for b in page["bucket_list"]] == \
                [{k: v for k, v in b.items() if k != "bytes"} for b in before["bucket_list"]]
            _equals_sql(conn, page)
            assert not any(kv.opened for kv in kvs), "the page (or COUNT(*)) opened RocksDB"
            conn.table("pk").upsert(pa.table({"id": pa.array([100, 101], pa.int64()), "name": ["x", "y"]}))
            assert any(kv.opened for kv in kvs)
            snapshots = conn.table("pk").snapshot()  # (a checkpoint of each changed bucket opens it)
            page = admin.ok("/api/table?name=default.pk")
            assert page["row_count"] == 27
            _equals_sql(conn, page)
            assert {b["bucket"]: b["kv_snapshot_offset"] for b in page["bucket_list"]} == \
                {b: (s["offset"] if s else None) for b, s in snapshots.items()}
    finally:
        running.stop()


def test_the_lake_page_equals_the_lake_views(console):
    lake = console.http("admin").ok("/api/lake")
    assert lake["enabled"] and [t["table"] for t in lake["tables"]] == ["default.lakey"]
    (page,) = lake["tables"]
    with console.connect() as conn:
        snapshots = conn.sql("SELECT snapshot_id, total_rows FROM default.`lakey$lake$snapshots`").to_pylist()
        status = conn.sql("SELECT * FROM default.`lakey$lake$status`").to_pylist()
    assert page["snapshots"] == len(snapshots) >= 1
    assert [s["snapshot_id"] for s in page["recent_snapshots"]] == [s["snapshot_id"] for s in snapshots][::-1]
    assert page["recent_snapshots"][0]["total_rows"] == snapshots[-1]["total_rows"] == 30
    assert page["lag_records"] == sum(s["lag_records"] for s in status) == 0
    assert page["last_snapshot_id"] == status[0]["last_snapshot_id"] == snapshots[-1]["snapshot_id"]
    assert page["last_commit"] == int(status[0]["last_commit"].timestamp() * 1000)
    iceberg = LakeCatalog(console.lake).load_table(TablePath("default", "lakey"))
    assert page["files"] == len(iceberg.inspect.files()) >= 1


def test_each_user_sees_only_what_describe_allows(console):
    admin, alice, bob = console.http("admin"), console.http("alice"), console.http("bob")
    assert _listed(admin.ok("/api/tables")) == ALL_TABLES
    assert _listed(alice.ok("/api/tables")) == ALICE_TABLES
    assert _listed(bob.ok("/api/tables")) == set()
    # An ungranted table answers exactly as an absent one.
    hidden, absent = alice.get("/api/table?name=default.daily"), alice.get("/api/table?name=default.nope")
    assert hidden.status == absent.status == 404
    assert hidden.body["error"].replace("daily", "nope") == absent.body["error"]
    assert alice.ok("/api/table?name=default.events")["row_count"] == 40
    assert bob.get("/api/table?name=default.events").status == 404
    assert [t["table"] for t in alice.ok("/api/lake")["tables"]] == ["default.lakey"]
    assert bob.ok("/api/lake")["tables"] == []
    # The cluster and the server-wide rates need DESCRIBE on the cluster, as a metrics scrape.
    for path in ("/api/cluster", "/api/rates"):
        assert admin.get(path).status == 200
        assert alice.get(path).status == bob.get(path).status == 403
    with console.connect() as conn:
        conn.sql("GRANT DESCRIBE ON CLUSTER TO bob")
        try:
            assert bob.get("/api/cluster").status == 200
        finally:
            conn.sql("REVOKE DESCRIBE ON CLUSTER FROM bob")
    assert bob.get("/api/cluster").status == 403
    assert console.http(None).get("/api/tables").status == 401


def test_login_cookie_basic_and_wrong_passwords(console):
    anonymous = console.http(None)
    refused = anonymous.get("/api/whoami")
    assert refused.status == 401 and refused.headers["WWW-Authenticate"].startswith("Basic")
    assert anonymous.get("/").status == 303 and anonymous.get("/").headers["Location"] == "/login"
    assert anonymous.get("/login").status == 200
    assert console.http("alice").ok("/api/whoami") == {"user": "alice", "super": False, "auth": True}
    wrong = console.http(None)
    wrong.credentials = ("alice", "not-her-password")
    assert wrong.get("/api/whoami").status == 401
    # A login sets an HttpOnly session cookie; a wrong password sets none.
    browser = console.http(None)
    bad = browser.call("POST", "/api/login", {"user": "alice", "password": "nope"})
    assert bad.status == 401 and "Set-Cookie" not in bad.headers and not list(browser.jar)
    good = browser.call("POST", "/api/login", {"user": "alice", "password": PASSWORDS["alice"]})
    cookie = good.headers["Set-Cookie"]
    assert good.status == 200 and "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=3600" in cookie
    assert browser.ok("/api/whoami")["user"] == "alice"
    assert _listed(browser.ok("/api/tables")) == ALICE_TABLES
    assert browser.get("/").status == 200
    # A POST on the strength of the cookie alone (another site's form) is refused.
    forged = browser.call("POST", "/api/queries/cancel", {"number": 1})
    assert forged.status == 403
    assert browser.call("POST", "/api/queries/cancel", {"number": 10**9},
                        {"X-Flightstore-Console": "1"}).status == 404
    assert browser.call("POST", "/api/logout", {}, {"X-Flightstore-Console": "1"}).status == 200
    assert browser.get("/api/whoami").status == 401
    # A forged cookie admits no one.
    forged_cookie = console.http(None)
    assert forged_cookie.call("GET", "/api/whoami", None, {"Cookie": "flightstore_console=made-up"}).status == 401


ROWS = 20_000
# 8 G hashes (minutes of DuckDB) streamed as they match: only a cancel ends it within the test.
SLOW = "SELECT a.id, b.id FROM slow a, slow b, slow c WHERE c.id < 20 AND hash(a.id * 31 + b.id + c.id) % 5000 = 0"


def _run(console, user: str, ended: list) -> threading.Thread:
    """``SLOW`` as ``user`` over Flight SQL in a thread, read chunk by chunk (``read_all`` would
    turn a CANCELLED status into a KeyboardInterrupt of the main thread: pyarrow's signal
    handling); ``ended`` gets "finished" or the error it ended with."""
    def run() -> None:
        client = flight.FlightClient(console.uri)
        try:
            options = flight.FlightCallOptions(headers=[client.authenticate_basic_token(user, PASSWORDS[user])])
            command = protocol.pack_any(protocol.CommandStatementQuery(query=SLOW))
            info = client.get_flight_info(flight.FlightDescriptor.for_command(command), options)
            reader = client.do_get(info.endpoints[0].ticket, options)
            while True:
                reader.read_chunk()
        except StopIteration:
            ended.append("finished")
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            ended.append(exc)
        finally:
            client.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_cancel_stops_a_running_query(console):
    with console.connect() as conn:
        conn.sql("CREATE TABLE slow (id BIGINT) WITH ('bucket.num' = '2')")
        conn.table("slow").append(pa.table({"id": np.arange(ROWS, dtype=np.int64)}))
        conn.sql("GRANT READ ON TABLE default.slow TO alice")
    admin, alice, bob = console.http("admin"), console.http("alice"), console.http("bob")
    for canceller in (alice, admin):  # her own query; then a super user stops hers
        ended: list = []
        thread = _run(console, "alice", ended)
        query = wait_until(lambda: next((q for q in admin.ok("/api/queries")["queries"] if q["sql"] == SLOW), None),
                           "the query listed as running", timeout=60)
        assert query["user"] == "alice" and query["started_ms"] <= time.time() * 1000
        assert alice.ok("/api/queries")["queries"] == [query]
        assert bob.ok("/api/queries")["queries"] == []  # not his, and he is no super user
        assert bob.call("POST", "/api/queries/cancel", {"number": query["number"]}).status == 404
        assert not ended
        answer = canceller.call("POST", "/api/queries/cancel", {"number": query["number"]})
        assert answer.status == 200 and answer.body["cancelled"], answer.body
        thread.join(timeout=60)
        assert not thread.is_alive()
        (error,) = ended
        assert isinstance(error, flight.FlightCancelledError), error
        wait_until(lambda: admin.ok("/api/queries")["queries"] == [], "the query gone from the list", timeout=30)


def test_rates_sum_to_the_servers_counters(console):
    with console.connect() as conn:
        conn.table("accounts").lookup(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
        conn.table("events").append(pa.table({"id": pa.array([100, 101], pa.int64()),
                                              "kind": ["x", "y"], "note": [None, "n"]}))
    console.server.console.rates.sample_now()
    rates = console.http("admin").ok("/api/rates")
    metrics = console.server.metrics
    written = sum(s.value for f in metrics.rows_in.collect() for s in f.samples if s.name.endswith("_total"))
    points = rates["points"]
    # Every row written since the console started (before the tables were made) is in the rates:
    # each point's rate times its interval, summed, is the server's counter.
    ends = [p["t"] for p in points]
    starts = [console.server.console.rates._samples[0].at_ms] + ends[:-1]
    assert sum(p["rows_in"] * (end - start) / 1000 for p, start, end in zip(points, starts, ends)) \
        == pytest.approx(written)
    assert written >= 40 + 30 + 30 + 3 + 30 + 2
    assert any(p["lookup_p50"] is not None for p in points)
    assert all(p["lookup_p50"] <= p["lookup_p99"] for p in points if p["lookup_p50"] is not None)
