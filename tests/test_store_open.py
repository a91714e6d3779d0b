"""Opening a data directory: one table's open never blocks the others, and what opening reads does
not grow with the number of records."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from flightstore.catalog import read_table_dir
from flightstore.errors import CorruptData
from flightstore.kv.tablet import KvTablet
from flightstore.store import Store, Table

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


def _rows(ids) -> dict:
    return {"id": list(ids), "v": [f"v{i}" for i in ids]}


def test_an_open_in_progress_blocks_no_lookup_write_or_open_of_other_tables(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        for name in ("slow", "fast", "other"):
            store.create_table(name, SCHEMA, primary_key=["id"]).upsert(_rows(range(10)))
    entered, release = threading.Event(), threading.Event()
    original = Table.__init__

    def held_open(self, descriptor, directory, **kwargs):  # an open (recovery) in progress
        if descriptor.path.table == "slow":
            entered.set()
            assert release.wait(60)
        original(self, descriptor, directory, **kwargs)

    monkeypatch.setattr(Table, "__init__", held_open)
    with Store(data_dir, fsync=False) as store:
        fast = store.table("fast")
        opened: list = []
        openers = [threading.Thread(target=lambda: opened.append(store.table("slow")))
                   for _ in range(2)]
        done: list = []

        def other_work() -> None:
            done.append(store.table("fast").lookup({"id": [3]}).to_pylist())
            fast.upsert(_rows([100]))
            done.append(store.table("fast").row_count())
            done.append(store.table("other").lookup({"id": [4]}).to_pylist())  # opens "other"
            store.create_table("new", SCHEMA)
            done.append(store.list_tables())

        try:
            openers[0].start()
            assert entered.wait(30)
            openers[1].start()  # a second caller of the same table waits for that one open
            worker = threading.Thread(target=other_work)
            worker.start()
            worker.join(timeout=60)
            assert not worker.is_alive(), "work on other tables waited for the slow open"
            assert all(t.is_alive() for t in openers)  # ...which is still in progress
            assert done == [[{"id": 3, "v": "v3"}], 11, [{"id": 4, "v": "v4"}],
                            ["fast", "new", "other", "slow"]]
        finally:
            release.set()
            for thread in openers:
                thread.join(timeout=60)
        assert len(opened) == 2 and opened[0] is opened[1]  # opened once
        assert opened[0].lookup({"id": [9]}).to_pylist() == [{"id": 9, "v": "v9"}]


def test_drop_waits_for_an_open_in_progress_of_that_table(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("t", SCHEMA, primary_key=["id"]).upsert(_rows(range(3)))
    directory = read_table_dir(data_dir, "t")
    entered, release = threading.Event(), threading.Event()
    original = Table.__init__

    def held_open(self, descriptor, directory, **kwargs):
        entered.set()
        assert release.wait(60)
        original(self, descriptor, directory, **kwargs)

    monkeypatch.setattr(Table, "__init__", held_open)
    with Store(data_dir, fsync=False) as store:
        opener = threading.Thread(target=store.table, args=("t",))
        opener.start()
        assert entered.wait(30)
        dropper = threading.Thread(target=store.drop_table, args=("t",))
        dropper.start()
        release.set()
        opener.join(timeout=60)
        dropper.join(timeout=60)
        assert not opener.is_alive() and not dropper.is_alive()
        # Had the drop not waited, the open would have recreated the directory it deleted and
        # kept serving a dropped table.
        assert store.list_tables() == []
        assert not directory.exists()
        assert "t" not in {p.table for p in store._tables}


def test_a_bucket_that_cannot_open_fails_the_open_and_leaves_no_bucket_open(tmp_path, monkeypatch):
    """A primary-key table's buckets open on threads: when one cannot open, the open raises that
    bucket's error, every bucket that did open is closed again, and the next open (the cause
    gone) serves the table whole."""
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("t", SCHEMA, primary_key=["id"], options={"bucket.num": "6"}).upsert(_rows(range(60)))
    opened: list = []
    original = KvTablet.__init__

    def failing_open(self, directory, descriptor, log, **kwargs):
        opened.append((self, log))
        if kwargs.get("bucket") == 4:
            raise CorruptData("table default.t bucket 4: cannot be opened (injected)")
        original(self, directory, descriptor, log, **kwargs)

    with Store(data_dir, fsync=False) as store:
        monkeypatch.setattr(KvTablet, "__init__", failing_open)
        with pytest.raises(CorruptData, match="bucket 4"):
            store.table("t")
        monkeypatch.undo()
        assert len(opened) == 6
        assert all(log.closed for _, log in opened)
        assert all(getattr(kv, "_db", None) is None for kv, _ in opened)
        table = store.table("t")  # a KV left open would hold its RocksDB lock: this open would fail
        assert table.row_count() == 60
        assert table.lookup({"id": [41]}).to_pylist() == [{"id": 41, "v": "v41"}]
