"""The embedded API: writes, reads, bad input that writes nothing, idempotent writers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from flightstore.errors import (
    DataDirectoryInUse,
    InvalidInput,
    InvalidOption,
    OutOfOrderSequence,
    SchemaMismatch,
    TableNotFound,
    Unsupported,
)
from flightstore.expressions import Comparison
from flightstore.store import Store

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def pk_table(store, buckets=4):
    return store.create_table("default.users", SCHEMA, primary_key=["id"], options={"bucket.num": buckets})


def data(n, start=0):
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "name": [f"n{i}" for i in range(start, start + n)],
                     "score": [float(i) for i in range(start, start + n)]})


def test_lookup_prefix_scan_count(store):
    table = pk_table(store)
    table.upsert(data(100))
    assert table.row_count() == 100
    got = table.lookup({"id": [5, 99, 1000, 3]})
    assert got.column("id").to_pylist() == [5, 99, 3]
    assert table.prefix_lookup({"id": [7]}).column("name").to_pylist() == ["n7"]
    filtered = table.scan_table(["id"], Comparison("score", ">=", 95))
    assert sorted(filtered.column("id").to_pylist()) == [95, 96, 97, 98, 99]
    assert table.scan_table(limit=7).num_rows == 7
    assert sum(1 for _ in table.scan(["name"])) >= 1


def test_composite_key_prefix_lookup(store):
    schema = pa.schema([("user", pa.int64()), ("order", pa.int64()), ("amount", pa.float64())])
    table = store.create_table("orders", schema, primary_key=["user", "order"],
                               options={"bucket.num": 3, "bucket.key": "user"})
    table.upsert(pa.table({"user": [1, 1, 2, 1, 3], "order": [10, 11, 10, 12, 1], "amount": [1.0] * 5}))
    got = table.prefix_lookup({"user": [1]})
    assert got.column("order").to_pylist() == [10, 11, 12]
    assert table.prefix_lookup({"user": [2, 3]}).num_rows == 2
    with pytest.raises(InvalidInput, match="leading primary key"):
        table.prefix_lookup({"order": [10]})


def test_prefix_lookup_of_many_prefixes_answers_in_prefix_order(store):
    """Many prefixes over every bucket are read a bucket at a time; the answer still comes in the
    order of the prefixes asked (each prefix's rows in key order), absent prefixes answer nothing,
    and neighbouring keys (user 1 vs 10) do not leak into each other's prefix."""
    schema = pa.schema([("user", pa.int64()), ("order", pa.int64()), ("amount", pa.float64())])
    table = store.create_table("orders", schema, primary_key=["user", "order"],
                               options={"bucket.num": 3, "bucket.key": "user"})
    users = [u for u in range(40) for _ in range(u % 4)]  # user u has u % 4 orders
    table.upsert(pa.table({"user": users, "order": [(u * 7 + i) % 5 for i, u in enumerate(users)],
                           "amount": [float(u) for u in users]}))
    asked = [10, 3, 27, 1, 100, 38, 0, 2, 19, 11]
    got = table.prefix_lookup({"user": asked}, ["user", "order"])
    stored = sorted(set(zip(users, [(u * 7 + i) % 5 for i, u in enumerate(users)])))
    expected = [row for user in asked for row in stored if row[0] == user]
    assert len(expected) > 10
    assert list(zip(got.column("user").to_pylist(), got.column("order").to_pylist())) == expected
    limited = table.prefix_lookup({"user": asked}, ["user", "order"], limit=4)
    assert list(zip(limited.column("user").to_pylist(), limited.column("order").to_pylist())) == expected[:4]
    assert table.prefix_lookup({"user": [100, 4]}).num_rows == 0


def test_log_table_append_scan_changelog(store):
    table = store.create_table("events", SCHEMA, options={"bucket.num": 2})
    table.append(data(10))
    table.append(data(5, 10))
    assert table.row_count() == 15
    assert sorted(table.scan_table(["id"]).column("id").to_pylist()) == list(range(15))
    rows = [r for b in range(2) for batch in table.read_changelog(b) for r in batch.to_pylist()]
    assert {r["_change_type"] for r in rows} == {"+A"}
    assert len(rows) == 15
    with pytest.raises(Unsupported):
        table.upsert(data(1))


@pytest.mark.parametrize("bad, error, message", [
    (pa.table({"id": [1], "nope": [1]}), SchemaMismatch, "no column"),
    (pa.table({"id": pa.array([None, 2], pa.int64()), "name": ["a", "b"], "score": [1.0, 2.0]}),
     InvalidInput, "must not be null"),
    (pa.table({"id": ["x"], "name": ["a"], "score": [1.0]}), SchemaMismatch, "does not fit"),
    (pa.table({"name": ["a"], "score": [1.0]}), SchemaMismatch, "id"),
])
def test_bad_writes_raise_and_write_nothing(store, bad, error, message):
    table = pk_table(store)
    table.upsert(data(3))
    before = table.end_offsets()
    with pytest.raises(error, match=message):
        table.upsert(bad)
    assert table.end_offsets() == before
    assert table.row_count() == 3


def test_partial_update_with_unknown_column_writes_nothing(store):
    table = pk_table(store)
    table.upsert(data(3))
    with pytest.raises(SchemaMismatch, match="no column"):
        table.upsert(pa.table({"id": [1], "bogus": [1]}), columns=["id", "bogus"])
    with pytest.raises(SchemaMismatch, match="primary key"):
        table.upsert(pa.table({"name": ["x"]}), columns=["name"])
    assert table.lookup({"id": [1]}).column("name").to_pylist() == ["n1"]


def test_null_key_in_second_bucket_writes_nothing_anywhere(store):
    table = pk_table(store)
    bad = pa.table({"id": pa.array(list(range(20)) + [None], pa.int64()),
                    "name": ["a"] * 21, "score": [1.0] * 21})
    with pytest.raises(InvalidInput):
        table.upsert(bad)
    assert table.row_count() == 0
    assert all(offset == 0 for offset in table.end_offsets().values())


def test_unknown_and_ill_typed_options_are_refused(store):
    with pytest.raises(InvalidOption, match="unknown table option 'bucket.nums'"):
        store.create_table("t1", SCHEMA, options={"bucket.nums": 3})
    with pytest.raises(InvalidOption, match="'bucket.num'"):
        store.create_table("t2", SCHEMA, options={"bucket.num": "four"})
    with pytest.raises(InvalidOption, match="table.merge-engine"):
        store.create_table("t3", SCHEMA, primary_key=["id"], options={"table.merge-engine": "nope"})
    assert store.list_tables() == []


def test_idempotent_writer_applies_retry_once_and_refuses_gaps(tmp_path):
    with Store(tmp_path) as store:
        table = pk_table(store)
        log = store.create_table("log", SCHEMA, options={"bucket.num": 2, "bucket.key": "id"})
        for t, write in ((table, table.upsert), (log, log.append)):
            write(data(10), writer_id="w1", sequence=0)
            retry = write(data(10), writer_id="w1", sequence=0)
            assert retry.duplicate
            with pytest.raises(OutOfOrderSequence, match="next expected batch is 1"):
                write(data(1, 50), writer_id="w1", sequence=5)
            write(data(5, 10), writer_id="w1", sequence=1)
        assert log.row_count() == 15
        offsets = table.end_offsets()
    with Store(tmp_path) as store:  # writer state survives a restart
        table = store.table("users")
        assert table.upsert(data(5, 10), writer_id="w1", sequence=1).duplicate
        assert table.end_offsets() == offsets
        assert store.table("log").append(data(5, 10), writer_id="w1", sequence=1).duplicate
        assert store.table("log").row_count() == 15


def test_catalog_survives_restart_and_reports_missing_data(tmp_path):
    import shutil
    with Store(tmp_path) as store:
        store.create_database("shop")
        store.create_table("shop.a", SCHEMA, primary_key=["id"]).upsert(data(3))
        store.create_table("shop.b", SCHEMA)
    with Store(tmp_path) as store:
        assert store.list_databases() == ["default", "shop"]
        assert store.list_tables("shop") == ["a", "b"]
        assert store.table("shop.a").row_count() == 3
        directory = store.catalog.table_dir(store.table("shop.b").path)
    shutil.rmtree(directory)
    from flightstore.errors import CorruptData
    with Store(tmp_path) as store:
        with pytest.raises(CorruptData, match="missing"):
            store.table("shop.b")
        assert not directory.exists()  # reported, not silently recreated
        with pytest.raises(TableNotFound):
            store.table("shop.zzz")
        store.drop_table("shop.b")
        assert store.list_tables("shop") == ["a"]


def test_log_ttl_retention_drops_expired_segments_only(tmp_path):
    import time as _time
    with Store(tmp_path) as store:
        table = store.create_table("events", SCHEMA, options={"table.log.ttl": "1h",
                                                              "table.log.segment.bytes": 1024})
        for i in range(5):
            table.append(data(50, i * 50))
        assert table.row_count() == 250
        assert store.enforce_retention() == 0  # nothing is an hour old yet
        later = int(_time.time() * 1000) + 2 * 3_600_000
        dropped = store.enforce_retention(now_ms=later)
        assert dropped > 0
        assert table.row_count() == 250 - dropped
        remaining = table.scan_table(["id"]).column("id").to_pylist()
        assert remaining == list(range(dropped, 250))  # the newest rows (active segment) stay
        pk = store.create_table("kv", SCHEMA, primary_key=["id"], options={"table.log.ttl": "1h"})
        pk.upsert(data(10))
        assert pk.enforce_retention(now_ms=later) == 0  # PK logs feed KV recovery: kept


def test_retention_opens_a_closed_table_only_when_something_may_expire(tmp_path, monkeypatch):
    """The server's sweep (every log.retention.check-interval) reads a closed table's oldest
    segment summary instead of opening it: a table with nothing past its TTL stays closed (opening
    every table each minute cost a 1,000-table server half a core and all their memory), and one
    with an expired segment is opened and trimmed as before, partitioned tables included."""
    import time as _time
    options = {"table.log.ttl": "1h", "table.log.segment.bytes": 1024, "bucket.num": 2}
    with Store(tmp_path) as store:
        for name in ("fresh", "old"):
            table = store.create_table(name, SCHEMA, options=options)
            for i in range(5):
                table.append(data(50, i * 50))
        store.create_table("parts", pa.schema([*SCHEMA, ("day", pa.string())]), partition_keys=["day"],
                           options=options)
        for i in range(5):
            store.table("parts").append(data(50, i * 50).append_column("day", pa.array(["d1"] * 50)))
        store.create_table("untimed", SCHEMA, options={"table.log.segment.bytes": 1024}).append(data(250))
    later = int(_time.time() * 1000) + 2 * 3_600_000
    with Store(tmp_path) as store:
        assert store.enforce_retention() == 0
        assert store.open_tables() == []  # nothing was past its TTL: nothing opened
        # The next sweeps read no directory again: a closed table's files have not changed.
        listed = []
        real_listdir = os.listdir
        monkeypatch.setattr(os, "listdir", lambda path: listed.append(path) or real_listdir(path))
        assert store.enforce_retention() == 0
        monkeypatch.setattr(os, "listdir", real_listdir)
        assert listed == []
        store.table("fresh")  # an open table is swept as before
        assert store.enforce_retention(now_ms=later) > 0
        assert {str(t.path) for t in store.open_tables()} == {"default.fresh", "default.old", "default.parts"}
        for name in ("fresh", "old", "parts"):
            assert 0 < store.table(name).row_count() < 250  # the active segments stay
        assert store.enforce_retention(now_ms=later) == 0


def test_writes_refuse_values_of_another_kind_but_accept_widening(store):
    table = pk_table(store)
    with pytest.raises(SchemaMismatch, match="does not fit"):
        table.upsert(pa.table({"id": [1], "name": pa.array([5], pa.int64()), "score": [1.0]}))
    with pytest.raises(SchemaMismatch, match="does not fit"):
        table.upsert(pa.table({"id": ["1"], "name": ["a"], "score": [1.0]}))
    table.upsert(pa.table({"id": pa.array([1], pa.int32()), "name": ["a"], "score": pa.array([2], pa.int16())}))
    assert table.lookup({"id": [1]}).to_pylist() == [{"id": 1, "name": "a", "score": 2.0}]
    with pytest.raises(SchemaMismatch):
        table.upsert(pa.table({"id": pa.array([2**40], pa.int64()).cast(pa.float64()), "name": ["a"],
                               "score": [1.0]}))
    assert table.row_count() == 1


def test_retry_on_a_round_robin_log_table_is_applied_once(store):
    table = store.create_table("rr", SCHEMA, options={"bucket.num": 3})  # no bucket key
    table.append(data(4), writer_id="w", sequence=0)
    for _ in range(3):  # each retry would be routed to the next bucket
        assert table.append(data(4), writer_id="w", sequence=0).duplicate
    assert table.row_count() == 4
    table.append(data(2, 4), writer_id="w", sequence=1)
    assert table.row_count() == 6


def test_a_data_directory_has_one_open_store_at_a_time(tmp_path):
    with Store(tmp_path) as store:
        store.create_table("t", SCHEMA).append(data(3))
        with pytest.raises(DataDirectoryInUse, match=f"pid {os.getpid()}"):
            Store(tmp_path)
        assert store.table("t").row_count() == 3  # the refused open changed nothing
    with Store(tmp_path) as again:  # closed: free again
        assert again.table("t").row_count() == 3


def test_the_lock_of_a_killed_process_is_released(tmp_path):
    script = ("import sys, flightstore; s = flightstore.Store(sys.argv[1]); "
              "print('open', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DataDirectoryInUse, match=f"pid {holder.pid}"):
            Store(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=20)
    with Store(tmp_path) as store:  # a crash leaves no stale lock behind
        assert store.list_databases() == ["default"]
