"""A primary-key table opened again answers its figures from a read-only look at each KV and opens
RocksDB for writing only when rows are read or written (kv/tablet.py: the deferred open); what it
answers is what the eager open answered, before and after RocksDB opens, while written meanwhile."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.store import Store

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


def _rows(ids, tag: str) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table({"id": ids, "v": [f"{tag}{i}" for i in ids]}, schema=SCHEMA)


def _figures(table) -> dict:
    """What the console's table page and COUNT(*) read of a primary-key table (but its bytes on
    disk: RocksDB's own files change as it closes and opens)."""
    return {"rows": table.row_count(), "start": table.start_offsets(), "end": table.end_offsets(),
            "applied": [kv.applied_offset for kv in table.kvs], "writers": [kv.writer_state() for kv in table.kvs],
            "snapshots": [None if kv.snapshots.newest is None else kv.snapshots.newest.offset for kv in table.kvs]}


def _contents(table) -> list[dict]:
    return pa.Table.from_batches(list(table.scan()), table.schema).sort_by("id").to_pylist()


def _fill(store: Store) -> None:
    table = store.create_table("db.pk", SCHEMA, primary_key=["id"], options={"bucket.num": "4"})
    table.upsert(_rows(range(100), "a"), writer_id="w1", sequence=0)
    table.upsert(_rows(range(0, 100, 3), "b"), writer_id="w1", sequence=1)  # updates: changelog > rows
    table.delete(pa.table({"id": pa.array(range(0, 20, 2), pa.int64())}), writer_id="w2", sequence=0)
    table.snapshot()
    table.upsert(_rows(range(100, 110), "c"))  # after the snapshot: the tail a reader folds


def test_a_reopened_table_answers_without_opening_rocksdb_and_equally_after(tmp_path):
    with Store(tmp_path / "data", fsync=False) as store:
        store.create_database("db")
        _fill(store)
        eager = store.table("db.pk")
        before, contents = _figures(eager), _contents(eager)
        assert all(kv.opened for kv in eager.kvs)
    with Store(tmp_path / "data", fsync=False) as store:
        table = store.table("db.pk")
        assert _figures(table) == before
        assert before["rows"] == 100 + 10 - 10 and before["writers"] != [{}] * 4
        assert not any(kv.opened for kv in table.kvs), "a reopened table opened RocksDB for its figures"
        # A lookup opens the buckets it reads, and only them; the figures stay what they were.
        found = table.lookup(pa.table({"id": pa.array([1, 3], pa.int64())}))
        assert found.to_pylist() == [{"id": 1, "v": "a1"}, {"id": 3, "v": "b3"}]
        opened = [kv.opened for kv in table.kvs]
        assert 0 < sum(opened) < 4
        assert _figures(table) == before
        # A retried batch is still known as one (the writers' state came from the read-only look).
        assert table.upsert(_rows([5], "dup"), writer_id="w1", sequence=1).duplicate
        assert not table.upsert(_rows([200, 201], "d"), writer_id="w2", sequence=1).duplicate
        assert _contents(table) == sorted(contents + _rows([200, 201], "d").to_pylist(), key=lambda r: r["id"])
        after = _figures(table)
        assert after["rows"] == before["rows"] + 2
    with Store(tmp_path / "data", fsync=False) as store:
        table = store.table("db.pk")
        assert _figures(table) == after
        # A prefix lookup (its one-snapshot path, without LIMIT) opens the buckets it reads too.
        found = table.prefix_lookup(pa.table({"id": pa.array([3, 200, 999], pa.int64())}))
        assert found.to_pylist() == [{"id": 3, "v": "b3"}, {"id": 200, "v": "d200"}]
        assert 0 < sum(kv.opened for kv in table.kvs) < 4


def test_a_kv_behind_its_log_opens_at_once_and_replays(tmp_path):
    """A crash between a write's log append and its RocksDB write leaves the KV behind its log:
    such a bucket is opened (and the log replayed into it) as before, so its count is right."""
    with Store(tmp_path / "data", fsync=False) as store:
        store.create_database("db")
        table = store.create_table("db.pk", SCHEMA, primary_key=["id"], options={"bucket.num": "1"})
        table.upsert(_rows(range(10), "a"))
        (kv,) = table.kvs
        prepared = kv.prepare(_rows(range(10, 15), "b"), np.full(5, changetype.UPDATE_AFTER, np.int8))
        kv.log.append(prepared.changelog)  # the log has it; RocksDB never got it
        assert kv.row_count == 10 and kv.applied_offset < kv.log.end_offset
    with Store(tmp_path / "data", fsync=False) as store:
        table = store.table("db.pk")
        (kv,) = table.kvs
        assert kv.opened and kv.applied_offset == kv.log.end_offset
        assert table.row_count() == 15 == len(_contents(table))


def test_reads_and_writes_racing_the_deferred_open(tmp_path):
    with Store(tmp_path / "data", fsync=False) as store:
        store.create_database("db")
        _fill(store)
        expected = {r["id"]: r["v"] for r in _contents(store.table("db.pk"))}
    with Store(tmp_path / "data", fsync=False) as store:
        table = store.table("db.pk")
        assert not any(kv.opened for kv in table.kvs)
        start = threading.Barrier(9)
        errors: list[BaseException] = []

        def read(seed: int) -> None:
            try:
                start.wait(timeout=60)
                ids = np.random.default_rng(seed).choice(sorted(expected), 40, replace=False)
                got = table.lookup(pa.table({"id": pa.array(ids, pa.int64())}))
                assert dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist())) == \
                    {int(i): expected[int(i)] for i in ids}
                assert len(expected) <= table.row_count() <= len(expected) + 50  # (buckets commit one by one)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        def write() -> None:
            try:
                start.wait(timeout=60)
                table.upsert(_rows(range(1000, 1050), "new"))
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(n,)) for n in range(8)] + [threading.Thread(target=write)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert table.row_count() == len(expected) + 50
        got = table.lookup(pa.table({"id": pa.array(range(1000, 1050), pa.int64())}))
        assert pc.all(pc.starts_with(got.column("v"), "new")).as_py() and got.num_rows == 50
