"""fsync on by default, and group commit: concurrent writers share fsyncs, none is acknowledged
before its record is on disk, and the fsync never runs under the table lock."""

from __future__ import annotations

import inspect
import os
import threading

import pyarrow as pa
import pytest

from flightstore.config import SERVER_OPTIONS
from flightstore.intents import IntentLog
from flightstore.log import LogTablet, durability
from flightstore.server.service import serve
from flightstore.store import Store
from tests.waiting import wait_until

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
WRITERS = 16


def _rows(start: int, n: int = 10) -> dict:
    return {"id": list(range(start, start + n)), "v": [f"v{i}" for i in range(start, start + n)]}


class HeldFsync:
    """Counts log fsyncs; the first one waits for ``release`` (a slow disk), then really syncs."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(60)
        os.fsync(fd)


def _run_writers(write, count: int) -> tuple[list[threading.Thread], list[int]]:
    returned: list[int] = []
    threads = [threading.Thread(target=lambda k=k: (write(k), returned.append(k)))
               for k in range(count)]
    return threads, returned


def test_concurrent_appends_share_one_fsync_and_none_returns_before_it(tmp_path, monkeypatch):
    fsync = HeldFsync()
    monkeypatch.setattr(durability, "fsync_file", fsync)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        threads, returned = _run_writers(lambda k: tablet.append(pa.table(_rows(k * 10))), WRITERS)
        try:
            threads[0].start()
            assert fsync.entered.wait(30)  # the first writer leads an fsync, held by the disk
            for thread in threads[1:]:
                thread.start()
            # every record is written while that fsync runs...
            wait_until(lambda: tablet.end_offset == WRITERS * 10, "every record written", timeout=60, poll=0.005)
            # ...but none is acknowledged: the first one's fsync is not done, the others' not begun
            assert returned == []
        finally:
            fsync.release.set()
            for thread in threads:
                thread.join(timeout=60)
        assert sorted(returned) == list(range(WRITERS))
        assert fsync.calls == 2 == tablet.fsyncs  # the 15 followers shared the second fsync
        assert tablet.sync() is None and fsync.calls == 2  # nothing new: no fsync


def test_store_writers_share_fsyncs_outside_the_table_lock(tmp_path, monkeypatch):
    """PK upserts through the Store: while one writer's fsync is held, the others still get the
    table lock, apply and append (so the fsync is not under it), then share the next fsync."""
    fsync = HeldFsync()
    with Store(tmp_path / "data") as store:
        assert store.fsync is True  # the default
        table = store.create_table("t", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                                   ("v", pa.string())]), primary_key=["id"])
        monkeypatch.setattr(durability, "fsync_file", fsync)
        threads, returned = _run_writers(lambda k: table.upsert(_rows(k * 10)), WRITERS)
        try:
            threads[0].start()
            assert fsync.entered.wait(30)
            for thread in threads[1:]:
                thread.start()
            wait_until(lambda: table.row_count() == WRITERS * 10, "every write applied", timeout=60, poll=0.005)
            assert returned == []
        finally:
            fsync.release.set()
            for thread in threads:
                thread.join(timeout=60)
        assert sorted(returned) == list(range(WRITERS))
        assert fsync.calls == 2


def test_fsync_is_the_default_of_the_store_and_the_server(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(durability, "fsync_file", lambda fd: calls.append(fd))
    assert SERVER_OPTIONS["log.fsync"].default is True
    assert inspect.signature(serve).parameters["fsync"].default is True
    with Store(tmp_path / "on") as store:
        store.create_table("t", SCHEMA).append(_rows(0))
    assert len(calls) == 1
    with Store(tmp_path / "off", fsync=False) as store:
        store.create_table("t", SCHEMA).append(_rows(0))
    assert len(calls) == 1  # no fsync at all without it


def test_multi_bucket_write_is_durable_in_every_bucket_before_its_intent_is_cleared(
        tmp_path, monkeypatch):
    seen: list[bool] = []
    original = IntentLog.complete

    def complete(self) -> None:
        if table is not None:
            seen.append(all(log._group.durable_offset == log.end_offset for log in table.logs))
        original(self)

    table = None
    monkeypatch.setattr(IntentLog, "complete", complete)
    with Store(tmp_path / "data") as store:
        table = store.create_table("t", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                                   ("v", pa.string())]), primary_key=["id"],
                                   options={"bucket.num": 4})
        table.upsert(_rows(0, 100))
        assert len({b for b, offset in table.end_offsets().items() if offset}) == 4
    assert seen[-1] is True


@pytest.mark.parametrize("fsync", [True, False])
def test_appends_survive_reopen_either_way(tmp_path, fsync):
    with LogTablet(tmp_path, SCHEMA, fsync=fsync) as tablet:
        for k in range(5):
            tablet.append(pa.table(_rows(k * 10)))
    with LogTablet(tmp_path, SCHEMA, fsync=fsync) as tablet:
        assert tablet.end_offset == 50
