"""KV snapshots: checkpoint + image at one log offset, retention floor, rebuild of a lost KV from a
snapshot and the log tail, leftovers of interrupted snapshots, and full scans from the image."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.errors import Cancelled, DataLoss, InvalidInput, OffsetOutOfRange
from flightstore.expressions import Comparison
from flightstore.kv.encoding import encode_keys
from flightstore.kv.image import KEY_COLUMN, Image
from flightstore.kv.tablet import KvTablet
from flightstore.store import Store

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("v", pa.float64())])
OPTIONS = {"bucket.num": 2, "table.log.ttl": "1ms", "table.log.segment.bytes": 2048,
           "kv.snapshot.num-retained": 2}


def rows(keys, tag: str) -> pa.Table:
    keys = list(keys)
    return pa.table({"k": pa.array(keys, pa.int64()), "name": [f"{tag}{k}" for k in keys],
                     "v": [float(k) for k in keys]}, schema=SCHEMA)


class Model:
    """The table every acknowledged write should leave, kept by plain Python."""

    def __init__(self) -> None:
        self.state: dict[int, dict] = {}

    def upsert(self, table, data: pa.Table) -> None:
        table.upsert(data)
        for row in data.to_pylist():
            self.state[row["k"]] = row

    def delete(self, table, keys) -> None:
        table.delete({"k": list(keys)})
        for k in keys:
            self.state.pop(k, None)

    def partial(self, table, keys, name: str) -> None:
        table.upsert({"k": list(keys), "name": [name] * len(keys)}, columns=["k", "name"])
        for k in keys:
            base = self.state.get(k, {"k": k, "name": None, "v": None})
            self.state[k] = {**base, "name": name}


def by_key(rows: list[dict]) -> dict[int, dict]:
    result = {r["k"]: r for r in rows}
    assert len(result) == len(rows), "a key came twice"
    return result


def contents(table) -> dict[int, dict]:
    return by_key(table.scan_table().to_pylist())


def rocksdb_contents(table) -> dict[int, dict]:
    """The rows RocksDB itself holds (not the image path)."""
    return by_key([r for kv in table.kvs for b in kv.scan() for r in b.to_pylist()])


def churn(table, model: Model, rounds: int, start: int = 0) -> None:
    """Updates, inserts, partial updates and deletes over a fixed key space."""
    for i in range(start, start + rounds):
        model.upsert(table, rows(range(i % 7, 120, 3), f"r{i}-"))
        model.partial(table, [i % 50, 60 + i % 13], f"p{i}")
        model.delete(table, [(i * 11) % 120])


@pytest.fixture
def table(store):
    return store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)


def test_snapshot_holds_the_kv_at_the_log_end_and_its_image_equals_rocksdb(table):
    model = Model()
    churn(table, model, 20)
    taken = table.snapshot()
    for bucket, info in taken.items():
        kv = table.kvs[bucket]
        assert info.offset == kv.applied_offset == table.logs[bucket].end_offset
        assert info.rows == kv.row_count
        assert (info.checkpoint / "CURRENT").is_file() and info.image_path.is_file()
        image = Image(info.image_path, info.image, table.schema)
        stored = pa.Table.from_batches(list(image.batches(range(len(SCHEMA) + 1))))
        rocks = pa.Table.from_batches(list(kv.scan()))
        assert stored.select(SCHEMA.names).equals(rocks)  # same rows, same (key) order
        assert stored.column(KEY_COLUMN).to_pylist() == encode_keys(rocks, ["k"])
    assert rocksdb_contents(table) == model.state


def test_an_unchanged_bucket_keeps_its_snapshot_unless_forced(table):
    table.upsert(rows(range(10), "a"))
    first = table.snapshot()
    assert table.snapshot() == first
    forced = table.snapshot(force=True)
    assert all(forced[b].id == first[b].id + 1 for b in first)
    table.upsert(rows([0], "b"))
    bucket = int(table.buckets_of(rows([0], "b"))[0])
    again = table.snapshot()
    assert again[bucket].id == forced[bucket].id + 1
    assert again[1 - bucket] == forced[1 - bucket]


def test_empty_bucket_gets_no_snapshot(store):
    table = store.create_table("e", SCHEMA, primary_key=["k"], options={"bucket.num": 1})
    assert table.snapshot() == {0: None}


def test_only_the_newest_snapshots_are_retained_and_the_floor_is_the_oldest(table):
    model = Model()
    offsets = []
    for round_ in range(4):
        churn(table, model, 3, start=round_ * 3)
        offsets.append(table.snapshot()[0].offset)
    snapshots = table.kvs[0].snapshots
    kept = snapshots.list()
    assert [s.id for s in kept] == [3, 4]
    assert sorted(p.name for p in snapshots.directory.iterdir()) == [f"{3:020d}", f"{4:020d}"]
    assert snapshots.retention_floor() == offsets[2] == kept[0].offset


def test_pk_changelog_is_deleted_below_the_oldest_retained_snapshot_only(table):
    model = Model()
    churn(table, model, 30)
    assert table.enforce_retention() == 0  # no snapshot yet: the whole changelog is the KV's backup
    assert table.start_offsets() == {0: 0, 1: 0}
    table.snapshot()
    churn(table, model, 30, start=30)
    table.snapshot()
    dropped = table.enforce_retention()
    assert dropped > 0
    for bucket, kv in enumerate(table.kvs):
        start = table.logs[bucket].start_offset
        floor = kv.snapshots.retention_floor()
        assert 0 < start <= floor  # moved, never past the oldest retained snapshot
        assert floor == kv.snapshots.list()[0].offset
    assert contents(table) == rocksdb_contents(table) == model.state


def _truncated_table(store, model: Model):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
    churn(table, model, 25)
    table.snapshot()
    churn(table, model, 25, start=25)
    table.snapshot()
    churn(table, model, 10, start=50)  # a tail after the newest snapshot
    assert table.enforce_retention() > 0
    assert all(offset > 0 for offset in table.start_offsets().values())
    return table


def test_a_deleted_kv_directory_is_rebuilt_from_the_snapshot_and_the_tail(tmp_path, caplog):
    model = Model()
    with Store(tmp_path) as store:
        table = _truncated_table(store, model)
        kv_dirs = [kv.directory for kv in table.kvs]
        newest = [kv.snapshots.newest.id for kv in table.kvs]
    for directory in kv_dirs:
        shutil.rmtree(directory)
    with caplog.at_level(logging.WARNING, logger="flightstore.kv"), Store(tmp_path) as store:
        table = store.table("t")
        assert [kv.recovered_from for kv in table.kvs] == [f"snapshot {n}" for n in newest]
        assert rocksdb_contents(table) == contents(table) == model.state
        assert table.row_count() == len(model.state)
    assert "the KV directory is missing; rebuilt it from KV snapshot" in caplog.text


def test_a_corrupted_kv_directory_is_rebuilt(tmp_path, caplog):
    model = Model()
    with Store(tmp_path) as store:
        kv_dir = _truncated_table(store, model).kvs[0].directory
    (kv_dir / "CURRENT").write_text("garbage")
    with caplog.at_level(logging.WARNING, logger="flightstore.kv"), Store(tmp_path) as store:
        table = store.table("t")
        assert table.kvs[0].recovered_from.startswith("snapshot")
        assert table.kvs[1].recovered_from == "kv"
        assert rocksdb_contents(table) == model.state
    assert "cannot be opened" in caplog.text


def test_an_unusable_newest_snapshot_falls_back_to_the_previous_one(tmp_path, caplog):
    model = Model()
    with Store(tmp_path) as store:
        table = _truncated_table(store, model)
        kv = table.kvs[0]
        older, newest = kv.snapshots.list()
        kv_dir = kv.directory
    for sst in (newest.checkpoint).glob("*.sst"):
        sst.unlink()  # the checkpoint cannot be opened any more
    shutil.rmtree(kv_dir)
    with caplog.at_level(logging.WARNING, logger="flightstore.kv"), Store(tmp_path) as store:
        table = store.table("t")
        assert table.kvs[0].recovered_from == f"snapshot {older.id}"
        assert rocksdb_contents(table) == model.state
    assert f"KV snapshot {newest.id} is unusable" in caplog.text


def test_no_usable_snapshot_over_a_truncated_log_is_data_loss(tmp_path):
    model = Model()
    with Store(tmp_path) as store:
        table = _truncated_table(store, model)
        kv = table.kvs[1]
        kv_dir, snapshot_dir = kv.directory, kv.snapshots.directory
    shutil.rmtree(kv_dir)
    shutil.rmtree(snapshot_dir)
    with Store(tmp_path) as store, pytest.raises(DataLoss, match=r"table default\.t bucket-1.*changes below"):
        store.table("t")


def test_the_kv_is_rebuilt_from_the_whole_log_while_it_starts_at_zero(tmp_path):
    model = Model()
    with Store(tmp_path) as store:
        table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
        churn(table, model, 12)
        kv_dir = table.kvs[0].directory
    shutil.rmtree(kv_dir)
    with Store(tmp_path) as store:
        table = store.table("t")
        assert table.kvs[0].recovered_from == "log"
        assert rocksdb_contents(table) == model.state


def test_leftovers_of_interrupted_snapshots_are_ignored_and_cleaned(tmp_path):
    """The states a kill -9 can leave in the snapshot directory, built by hand: a half-built
    ``.tmp`` snapshot, a half-deleted old one, and a published one whose image lost bytes."""
    model = Model()
    with Store(tmp_path) as store:
        table = _truncated_table(store, model)
        kv = table.kvs[0]
        good = kv.snapshots.newest
        snapshots_dir = kv.snapshots.directory
        kv_dir = kv.directory
    half_built = snapshots_dir / f"{good.id + 1:020d}.tmp"
    shutil.copytree(good.directory, half_built)
    (half_built / "snapshot.json").unlink()
    shutil.copytree(good.directory, snapshots_dir / f"{good.id - 5:020d}.deleting")
    torn = snapshots_dir / f"{good.id + 2:020d}"
    shutil.copytree(good.directory, torn)
    with open(torn / "image.arrow", "r+b") as image:
        image.truncate(os.path.getsize(torn / "image.arrow") // 2)
    shutil.rmtree(kv_dir)
    with Store(tmp_path) as store:
        table = store.table("t")
        kv = table.kvs[0]
        assert kv.snapshots.newest.id == good.id
        assert kv.recovered_from == f"snapshot {good.id}"
        assert sorted(p.name for p in snapshots_dir.iterdir()) == \
            sorted(s.directory.name for s in kv.snapshots.list())
        assert rocksdb_contents(table) == contents(table) == model.state
        table.snapshot(force=True)  # the next snapshot id does not collide with the leftovers
        assert kv.snapshots.newest.id == good.id + 1


def test_a_stopped_snapshot_leaves_the_previous_one(table):
    model = Model()
    churn(table, model, 10)
    first = table.snapshot()[0]
    churn(table, model, 5, start=10)
    with pytest.raises(Cancelled):
        table.kvs[0].snapshot(stop=lambda: True)
    snapshots = table.kvs[0].snapshots
    assert snapshots.newest == first
    assert [p.name for p in snapshots.directory.iterdir()] == [first.directory.name]


# ---- reads from the image ----------------------------------------------------------------------

def test_full_scans_read_the_image_plus_the_tail_and_equal_the_kv(table, monkeypatch):
    model = Model()
    churn(table, model, 20)
    table.snapshot()
    churn(table, model, 4, start=20)  # changes, inserts, partial updates, deletes after the image
    model.upsert(table, rows(range(500, 520), "new"))

    def no_rocksdb(*args, **kwargs):
        raise AssertionError("a full scan iterated RocksDB although an image exists")

    expected = rocksdb_contents(table)
    assert expected == model.state
    monkeypatch.setattr(KvTablet, "scan", no_rocksdb)
    assert contents(table) == expected
    only = table.scan_table(["name", "k"])
    assert only.column_names == ["name", "k"]
    assert {r["k"]: r["name"] for r in only.to_pylist()} == {k: r["name"] for k, r in expected.items()}
    wanted = {k: r for k, r in expected.items() if r["v"] is not None and r["v"] < 40}
    filtered = table.scan_table(None, Comparison("v", "<", 40.0))
    assert by_key(filtered.to_pylist()) == wanted
    assert table.scan_table(limit=7).num_rows == 7
    assert table.scan_table(["k"], Comparison("name", "=", "new505")).to_pylist() == [{"k": 505}]


def test_scans_fold_the_changelog_in_every_snapshot_state_and_rocksdb_only_past_the_fold_bound(
        table, monkeypatch):
    model = Model()
    churn(table, model, 3)
    calls = []
    original = KvTablet.scan

    def counting(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(KvTablet, "scan", counting)
    assert contents(table) == model.state
    assert calls == []  # no image yet: the whole changelog, folded
    table.snapshot()
    assert contents(table) == model.state
    churn(table, model, 8, start=3)  # a tail longer than the image
    assert contents(table) == model.state
    assert calls == []
    monkeypatch.setattr("flightstore.memory._limit", 4)  # a query may hold 1 byte
    churn(table, model, 1, start=11)
    assert contents(table) == model.state
    assert len(calls) == 2  # more updates to fold than a read may hold: RocksDB, in chunks


def test_a_corrupt_image_is_detected_and_scans_fall_back_to_rocksdb(table, caplog):
    model = Model()
    churn(table, model, 10)
    info = table.snapshot()[0]
    with open(info.image_path, "r+b") as image:  # flip a byte inside the data
        image.seek(info.image.bytes // 2)
        byte = image.read(1)
        image.seek(info.image.bytes // 2)
        image.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.ERROR, logger="flightstore.kv"):
        assert contents(table) == model.state
    assert "fails its CRC check" in caplog.text


def test_image_batches_are_skipped_by_statistics(store):
    table = store.create_table("big", SCHEMA, primary_key=["k"], options={"bucket.num": 1})
    table.upsert(rows(range(200_000), "x"))
    info = table.snapshot()[0]
    image = table.kvs[0].snapshots.image(info, table.schema)
    assert image.num_batches == 4
    predicate = Comparison("k", "<", 1000).bind(table.schema)
    assert len(list(image.batches([0], predicate))) == 1
    assert table.scan_table(["k"], Comparison("k", "<", 1000)).column("k").to_pylist() == list(range(1000))


def test_rows_at_an_older_offset_use_an_older_snapshot_and_the_changelog_up_to_it(table):
    model = Model()
    churn(table, model, 10)
    table.snapshot()
    churn(table, model, 3, start=10)
    middle_offset = table.end_offsets()[0]
    middle = {k: r for k, r in model.state.items() if table.buckets_of(rows([k], ""))[0] == 0}
    churn(table, model, 6, start=13)
    table.snapshot()  # newer than ``middle_offset``: the older snapshot serves it
    churn(table, model, 2, start=19)
    at_middle = pa.Table.from_batches(list(table.rows_at(0, middle_offset)))
    assert by_key(at_middle.to_pylist()) == middle
    now = pa.Table.from_batches(list(table.rows_at(0, table.end_offsets()[0])))
    assert by_key(now.to_pylist()) == \
        {k: r for k, r in model.state.items() if table.buckets_of(rows([k], ""))[0] == 0}
    table.snapshot()  # only the two newest remain: middle_offset has no snapshot at or below it
    table.enforce_retention()
    with pytest.raises(OffsetOutOfRange, match="earliest offset still held is"):
        list(table.rows_at(0, table.start_offsets()[0] - 1))


# ---- expired offsets ---------------------------------------------------------------------------

def test_readers_of_expired_offsets_get_a_clear_error_or_start_at_the_earliest(tmp_path):
    model = Model()
    with Store(tmp_path) as store:
        table = _truncated_table(store, model)
        start = table.start_offsets()[0]
        with pytest.raises(OffsetOutOfRange, match=f"earliest offset still held is {start}"):
            list(table.read_changelog(0, 0))
        first = next(table.read_changelog(0))  # no offset given: the earliest held
        assert first.column("_log_offset")[0].as_py() == start
        with pytest.raises(OffsetOutOfRange, match=f"earliest offset still held is {start}"):
            next(table.subscribe({0: start - 1}, heartbeat_s=None))
        batch = next(table.subscribe("earliest", heartbeat_s=None))
        assert batch.column("_log_offset")[0].as_py() == start


def test_a_subscriber_that_falls_behind_retention_gets_an_error_not_a_gap(table):
    model = Model()
    churn(table, model, 10)
    follower = table.subscribe("earliest", heartbeat_s=None)
    next(follower)  # positioned at offset 0 of bucket 0, more to read
    churn(table, model, 20, start=10)
    table.snapshot()
    churn(table, model, 20, start=30)
    table.snapshot()
    assert table.enforce_retention() > 0
    with pytest.raises(OffsetOutOfRange, match="expired"):
        for _ in range(10_000):
            next(follower)


def test_log_tablet_retention_never_passes_the_floor(tmp_path: Path):
    from flightstore.log import LogTablet
    schema = pa.schema([("x", pa.int64())])
    with LogTablet(tmp_path, schema, segment_bytes=1, ttl_ms=1) as log:
        for i in range(5):
            log.append(pa.table({"x": [i, i]}, schema=schema), timestamp_ms=0)
        assert log.enforce_retention(now_ms=10**12, floor=5) == 4  # segment [4, 6) holds offset 5
        assert log.enforce_retention(now_ms=10**12, floor=0) == 4
        assert log.enforce_retention(now_ms=10**12) == 8  # no floor: all but the active segment


def test_an_undo_whose_changelog_expired_is_refused_and_changes_nothing(table):
    model = Model()
    table.upsert(rows(range(40), "w0"), writer_id="job", sequence=0)
    churn(table, model, 20)
    table.snapshot()
    churn(table, model, 20, start=20)
    table.snapshot()
    assert table.enforce_retention() > 0  # the job's batch 0 left the changelog
    before = contents(table)
    with pytest.raises(InvalidInput, match="may have expired"):
        table.undo("job", -1)
    assert contents(table) == before
    table.upsert(rows(range(3), "w1"), writer_id="job", sequence=1)
    assert table.undo("job", 0) == 3  # batch 1 is still held: undone as usual


# ---- analytic scans without an image: the changelog from offset 0 -------------------------------

def test_analytic_scans_without_an_image_replay_the_changelog_not_rocksdb(store, monkeypatch):
    table = store.create_table("plain", SCHEMA, primary_key=["k"], options={"bucket.num": 2})
    model = Model()
    model.upsert(table, rows(range(1000, 1400), "bulk"))  # a bulk load: inserts alone
    churn(table, model, 6)  # then updates, partial updates, deletes, re-inserts
    model.upsert(table, rows(range(2000, 2050), "late"))
    expected = rocksdb_contents(table)
    assert expected == model.state

    def no_rocksdb(*args, **kwargs):
        raise AssertionError("an analytic scan iterated RocksDB although the changelog serves")

    monkeypatch.setattr(KvTablet, "scan", no_rocksdb)
    assert by_key(table.scan_table(exact=False).to_pylist()) == expected
    # rows come unfiltered (the caller filters again), skipping nothing the filter wants
    loose = table.scan_table(["k", "v"], Comparison("v", "<", 40.0), exact=False)
    wanted = {k: r["v"] for k, r in expected.items() if r["v"] is not None and r["v"] < 40}
    assert {r["k"]: r["v"] for r in loose.to_pylist() if r["v"] is not None and r["v"] < 40} == wanted
    assert by_key(table.scan_table().to_pylist()) == expected  # exact scans too (issue 20)


def test_a_changelog_much_longer_than_the_bucket_is_not_replayed(store, monkeypatch):
    table = store.create_table("plain", SCHEMA, primary_key=["k"], options={"bucket.num": 1})
    model = Model()
    churn(table, model, 3)
    calls = []
    original = KvTablet.scan

    def counting(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(KvTablet, "scan", counting)
    assert by_key(table.scan_table(exact=False).to_pylist()) == model.state
    assert calls == []
    monkeypatch.setattr("flightstore.memory._limit", 4)  # a query may hold 1 byte
    assert by_key(table.scan_table(exact=False).to_pylist()) == model.state
    assert len(calls) == 1


def test_changed_rows_take_a_run_of_inserts_as_it_is(store):
    from flightstore.kv.snapshot_read import changed_rows

    table = store.create_table("plain", SCHEMA, primary_key=["k"], options={"bucket.num": 1})
    table.upsert(rows(range(10), "a"))
    kv = table.kvs[0]
    inserted = changed_rows(kv.log, 0, kv.log.end_offset, ["k"], ["name"], "t")
    assert inserted.empty and inserted.rows.column("k").to_pylist() == list(range(10))
    table.upsert(rows([3, 12], "b"))
    table.delete({"k": [5]})
    mixed = changed_rows(kv.log, 0, kv.log.end_offset, ["k"], ["name"], "t")
    assert sorted(mixed.sorted_values.tolist()) == [3, 5]  # only the keys an update or delete touched
    assert {r["k"]: r["name"] for r in mixed.rows.to_pylist()} == \
        {**{k: f"a{k}" for k in range(10) if k not in (3, 5)}, 3: "b3", 12: "b12"}
