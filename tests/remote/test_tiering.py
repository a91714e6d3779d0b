"""Tiered log through a real server: closed segments uploaded by the background task, local ones
deleted, and every read still whole (SELECT *, COUNT, $changelog, subscribe from earliest), also
after a restart, on a local remote directory and on S3 (moto)."""

from __future__ import annotations

import pyarrow as pa

import flightstore
from flightstore.remote import RemoteLogManager
from flightstore.remote.uploader import release_uploaded
from flightstore.store import Store
from tests.remote.tables import EVENTS, TIERED, events
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

OPTIONS = "WITH ('bucket.num' = '2', 'table.log.segment.bytes' = '1024', " \
          "'table.log.tiered.local-segments' = '1')"


def _fold(changes: list[dict]) -> dict:
    state: dict = {}
    for row in changes:
        if row["_change_type"] in ("+I", "+U"):
            state[row["k"]] = row["v"]
        elif row["_change_type"] == "-D":
            del state[row["k"]]
    return state


def _check(conn, expected_state: dict) -> None:
    """Every read of both tables answers all of what was written."""
    everything = list(range(80))
    assert conn.sql("SELECT seq FROM ev ORDER BY seq").column("seq").to_pylist() == everything
    assert conn.sql("SELECT COUNT(*) AS n FROM ev").column("n").to_pylist() == [80]
    changelog = conn.sql("SELECT seq, _log_offset FROM ev$changelog")
    assert sorted(changelog.column("seq").to_pylist()) == everything
    ends = conn.table("ev").offsets()
    assert sorted(changelog.column("_log_offset").to_pylist()) == sorted(
        o for end in ends.values() for o in range(end))
    subscribed = pa.Table.from_batches(list(conn.table("ev").subscribe("earliest", columns=["seq"],
                                                                       until=ends)))
    assert sorted(subscribed.column("seq").to_pylist()) == everything
    pk_ends = conn.table("pk").offsets()
    log = conn.sql("SELECT k, v, _change_type, _log_offset FROM pk$changelog").to_pylist()
    assert sorted(r["_log_offset"] for r in log) == list(range(pk_ends[0]))
    assert _fold(sorted(log, key=lambda r: r["_log_offset"])) == expected_state
    stream = pa.Table.from_batches(list(conn.table("pk").subscribe("earliest", until=pk_ends)))
    assert _fold(stream.to_pylist()) == expected_state
    assert {r["k"]: r["v"] for r in conn.sql("SELECT k, v FROM pk").to_pylist()} == expected_state


def test_uploaded_and_deleted_segments_keep_every_read_whole(remote_options, tmp_path):
    options = {**remote_options, "remote.log.task-interval-duration": "100ms"}
    server = RunningServer(tmp_path / "data", options)
    try:
        with flightstore.connect(server.uri, timeout=120) as conn:
            conn.sql(f"CREATE TABLE ev (seq BIGINT, s STRING) {OPTIONS}")
            conn.sql("CREATE TABLE pk (k BIGINT NOT NULL, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                     "WITH ('table.log.segment.bytes' = '1024', 'table.log.tiered.local-segments' = '1')")
            ev, pk = conn.table("ev"), conn.table("pk")
            state: dict = {}
            for i in range(8):
                ev.append(events(i * 10, 10))
                keys = [(i * 3 + j) % 11 for j in range(4)]
                pk.upsert({"k": keys, "v": [i * 10 + j for j in range(4)]})
                state.update({k: i * 10 + j for j, k in enumerate(keys)})
                if i % 4 == 3:
                    pk.delete({"k": [keys[0]]})
                    state.pop(keys[0], None)
            tables = [server.store.table("default.ev"), server.store.table("default.pk")]
            wait_until(lambda: all(log.local_start_offset > 0 for t in tables for log in t.logs),
                       "old segments uploaded and then deleted locally", timeout=60)
            assert all(log.start_offset == 0 for t in tables for log in t.logs)
            _check(conn, state)
        server.stop()
        server = RunningServer(tmp_path / "data", options)  # manifests read back from storage
        with flightstore.connect(server.uri, timeout=120) as conn:
            assert server.store.table("default.ev").logs[0].local_start_offset > 0
            _check(conn, state)
    finally:
        server.stop()


def test_no_local_segment_goes_before_it_is_uploaded(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("remote storage cannot be written under a file")
    options = {"remote.data.dir": str(blocker / "remote")}
    with Store(tmp_path / "data", fsync=False, options=options) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(6):
            table.write(events(i * 10, 10))
        log = table.logs[0]
        manager = RemoteLogManager(store, 1000)
        assert manager.run_once() == {"segments": 0, "snapshots": 0, "released": 0}
        assert release_uploaded(log.remote, log, 1) == 0 and log.local_start_offset == 0
        assert len(log.sealed_segments()) >= 4
        sealed = len(log.sealed_segments())
        blocker.unlink()  # remote storage is back
        assert manager.run_once() == {"segments": sealed, "snapshots": 0, "released": sealed - 1}
        assert log.local_start_offset > 0 and len(log.sealed_segments()) == 1
        assert table.scan_table().column("seq").to_pylist() == list(range(60))
