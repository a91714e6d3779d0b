"""KV snapshots through a real server: the background thread takes them on the interval and stops
with the server, the snapshot action and the `flightstore snapshot` CLI take them on request, and
readers of an expired changelog get a clear error or start at the earliest offset held."""

from __future__ import annotations

import subprocess
import sys
import threading

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.client import connect
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

CREATE = ("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2', "
          "'table.log.ttl' = '1ms', 'table.log.segment.bytes' = '1024'{extra})")


def _load(table, rounds: int, start: int = 0) -> dict[int, str]:
    state = {}
    for i in range(start, start + rounds):
        keys = list(range(i % 5, 60, 5))
        table.upsert({"k": keys, "v": [f"v{i}"] * len(keys)})
        state.update({k: f"v{i}" for k in keys})
    return state


def test_the_server_takes_snapshots_on_the_interval_and_its_thread_stops_with_it(tmp_path):
    running = RunningServer(tmp_path / "data")
    try:
        conn = connect(running.uri)
        conn.sql(CREATE.format(extra=", 'kv.snapshot.interval' = '50ms'"))
        _load(conn.table("kv"), 5)
        table = running.store.table("kv")
        wait_until(lambda: all(kv.snapshots.newest is not None for kv in table.kvs), "a snapshot per bucket")
        offsets = table.end_offsets()
        wait_until(lambda: all(kv.snapshots.newest.offset == offsets[b] for b, kv in enumerate(table.kvs)),
                   "snapshots at the log end")
        ids = [kv.snapshots.newest.id for kv in table.kvs]
        _load(conn.table("kv"), 5, start=5)
        wait_until(lambda: all(kv.snapshots.newest.id > ids[b] for b, kv in enumerate(table.kvs)),
                   "new snapshots after new writes")
        wait_until(lambda: all(o > 0 for o in table.start_offsets().values()),
                   "retention after the snapshots")
        conn.close()
        assert running.server.housekeeping.alive
    finally:
        running.stop()
    assert not running.server.housekeeping.alive


def test_an_unchanged_table_is_not_snapshotted_again(tmp_path):
    running = RunningServer(tmp_path / "data")
    try:
        with connect(running.uri) as conn:
            conn.sql(CREATE.format(extra=", 'kv.snapshot.interval' = '20ms'"))
            _load(conn.table("kv"), 3)
            table = running.store.table("kv")
            wait_until(lambda: all(kv.snapshots.newest is not None for kv in table.kvs), "first snapshots")
            first = [kv.snapshots.newest.id for kv in table.kvs]
            # Several intervals pass without writes: the background thread skips the table.
            # (Observed through the schedule: the thread has looked at it again since.)
            due = table.upkeep.next_due_ms()
            wait_until(lambda: table.upkeep.next_due_ms() > due + 40, "the thread looking again")
            assert [kv.snapshots.newest.id for kv in table.kvs] == first
    finally:
        running.stop()


def test_snapshot_action_usage_and_expired_offsets_over_flight(server):
    conn = connect(server.uri)
    conn.sql(CREATE.format(extra=""))
    table = conn.table("kv")
    state = _load(table, 30)
    before = table.usage()
    assert before["start_offsets"] == {0: 0, 1: 0} and before["bytes"]["log"] > 0
    first = table.snapshot()
    assert {b: s["offset"] for b, s in first.items()} == table.offsets("end")
    state.update(_load(table, 30, start=30))
    second = table.snapshot()  # takes snapshots and applies retention
    assert all(second[b]["id"] == first[b]["id"] + 1 for b in first)
    after = table.usage()
    assert after["start_offsets"] == table.offsets("start")
    assert all(0 < after["start_offsets"][b] <= first[b]["offset"] for b in first)
    assert after["bytes"]["snapshots"] > 0 and after["bytes"]["total"] == sum(
        v for k, v in after["bytes"].items() if k != "total")
    state.update(_load(table, 2, start=60))
    assert {r["k"]: r["v"] for r in table.scan().to_pylist()} == state
    assert {r["k"]: r["v"] for r in conn.sql("SELECT k, v FROM kv").to_pylist()} == state

    # $changelog reads what is still held, from the earliest offset.
    changelog = conn.sql("SELECT _log_offset FROM `kv$changelog`")
    assert changelog.num_rows == sum(table.offsets("end")[b] - after["start_offsets"][b] for b in first)
    # Explicit offsets below it are refused with the earliest offset held.
    earliest = after["start_offsets"][0]
    with pytest.raises(pa.ArrowInvalid, match=f"earliest offset still held is {earliest}"):
        list(table.subscribe({0: earliest - 1}, until={0: earliest + 1}))
    with pytest.raises(pa.ArrowInvalid, match=f"earliest offset still held is {earliest}"):
        table.read_snapshot(0, earliest - 1)
    rows = list(table.subscribe("earliest", until=table.offsets("end")))
    assert sum(b.num_rows for b in rows) == changelog.num_rows

    # The rows at a snapshot's offset, as +I changelog rows with null offsets.
    at = second[0]["offset"]
    snap = table.read_snapshot(0, at)
    assert set(snap.column("_change_type").to_pylist()) == {"+I"}
    assert snap.column("_log_offset").null_count == snap.num_rows
    in_bucket = {r["k"] for r in table.scan().to_pylist()} & set(snap.column("k").to_pylist())
    assert len(in_bucket) == snap.num_rows
    conn.close()


def test_snapshot_of_a_log_table_is_refused(server):
    with connect(server.uri) as conn:
        conn.sql("CREATE TABLE ev (a BIGINT)")
        with pytest.raises(NotImplementedError, match="primary-key table"):
            conn.table("ev").snapshot()


def test_cli_snapshot_through_the_server_and_on_a_stopped_data_dir(tmp_path):
    data_dir = tmp_path / "data"
    process = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(data_dir),
                                "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        uri = process.stdout.readline().split(" at ")[-1].strip()
        with flightstore.connect(uri) as conn:
            conn.sql(CREATE.format(extra=""))
            _load(conn.table("kv"), 10)
        out = subprocess.run([sys.executable, "-m", "flightstore", "snapshot", "--uri", uri, "kv"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        assert "kv bucket 0: snapshot 1 at log offset" in out and "kv bucket 1: snapshot 1" in out
    finally:
        process.terminate()
        process.wait(timeout=60)
    with Store(data_dir) as store:
        store.table("kv").upsert({"k": [1000], "v": ["x"]})
    out = subprocess.run([sys.executable, "-m", "flightstore", "snapshot", "--data-dir", str(data_dir), "kv"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.count("snapshot 2") == 1 and out.count("snapshot 1") == 1  # only the changed bucket
    with Store(data_dir) as store:
        assert sorted(kv.snapshots.newest.id for kv in store.table("kv").kvs) == [1, 2]


def test_snapshot_requests_are_authorized(tmp_path):
    """Taking a snapshot is table upkeep (ALTER); its usage figures are metadata (DESCRIBE); the
    rows of a snapshot are table data (READ). A refused request takes no snapshot."""
    users = {"admin": "adm1n", "reader": "r3ad", "nobody": "n0b0dy"}
    store = Store(tmp_path / "data")
    server = FlightSqlServer(store, users=users, super_users=("admin",))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        def connect(user: str):
            return flightstore.connect(server.uri, username=user, password=users[user], timeout=60)

        with connect("admin") as admin:
            admin.sql(CREATE.format(extra=""))
            _load(admin.table("kv"), 5)
            admin.sql("GRANT READ ON TABLE default.kv TO reader")
        with connect("nobody") as nobody:  # without any grant, kv does not exist for nobody
            for call in (lambda t: t.snapshot(), lambda t: t.usage(), lambda t: t.read_snapshot(0, 1)):
                with pytest.raises(pa.ArrowKeyError, match="does not exist"):
                    call(nobody.table("kv"))
        with connect("reader") as reader:
            table = reader.table("kv")
            with pytest.raises(flight.FlightUnauthorizedError, match="may not ALTER table default.kv"):
                table.snapshot()
            assert all(kv.snapshots.newest is None for kv in store.table("kv").kvs)
            assert table.usage()["end_offsets"] == table.offsets("end")  # READ implies DESCRIBE
            at = table.offsets("end")[0]
            assert table.read_snapshot(0, at).num_rows == \
                sum(1 for r in table.scan(["k"]).to_pylist()
                    if store.table("kv").buckets_of(pa.table({"k": [r["k"]], "v": [""]}))[0] == 0)
        with connect("admin") as admin:
            admin.sql("GRANT ALTER ON TABLE default.kv TO reader")
        with connect("reader") as reader:
            assert all(info["id"] == 1 for info in reader.table("kv").snapshot().values())
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()
