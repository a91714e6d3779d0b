"""A bucket directory deleted entirely and rebuilt from remote storage equals the original up to
the offset the rebuild reports (log table; primary-key table from a KV snapshot plus the uploaded
log after it), KV snapshots follow ``kv.snapshot.num-retained`` remotely, and changes that were
never uploaded are reported lost, never silently missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flightstore import changetype
from flightstore.errors import DataLoss, InvalidInput
from flightstore.kv.tablet import changelog_schema
from flightstore.log import LogTablet
from flightstore.remote import RemoteLogManager, RemoteStorage, rebuild_bucket
from flightstore.remote.uploader import upload_snapshots
from flightstore.store import Store
from tests.remote.tables import EVENTS, ROWS, TIERED, events, rows


def _records(log) -> list[tuple[int, dict]]:
    """Every row of ``log`` with its offset."""
    return [(offset, row) for record in log.read(0)
            for offset, row in zip(record.row_offsets.to_pylist(), record.batch.to_pylist())]


def _fold(records: list[tuple[int, dict]], below: int) -> dict:
    state: dict = {}
    for offset, row in records:
        if offset >= below:
            break
        row = dict(row)
        kind = row.pop(changetype.CHANGE_TYPE_COLUMN)
        if kind in (changetype.INSERT, changetype.UPDATE_AFTER):
            state[row["k"]] = row["v"]
        elif kind == changetype.DELETE:
            del state[row["k"]]
    return state


def _kv_state(table) -> dict:
    return {r["k"]: r["v"] for r in table.scan_table().to_pylist()}


def _rebuild(remote_options, tmp_path, descriptor, directory: Path, bucket: int):
    remote = RemoteStorage.from_options(remote_options, tmp_path / "rebuilder")
    return rebuild_bucket(remote, descriptor, None, bucket, directory / f"bucket-{bucket}",
                          table_id=directory.name)


def test_log_bucket_rebuilt_equals_the_original_up_to_the_reported_offset(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "2", **TIERED})
        for i in range(8):
            table.write(events(i * 10, 10))
        RemoteLogManager(store, 1000).run_once()
        uploaded_end = table.logs[1].remote.log_manifest().end_offset
        for i in range(8, 12):  # a tail never uploaded
            table.write(events(i * 10, 10))
        original = {b: _records(log) for b, log in enumerate(table.logs)}
        descriptor, directory = table.descriptor, table.directory
    shutil.rmtree(directory / "bucket-1")
    rebuilt = _rebuild(local_remote, tmp_path, descriptor, directory, 1)
    assert (rebuilt.offset, rebuilt.log_start, rebuilt.log_end) == (uploaded_end, 0, uploaded_end)
    assert rebuilt.segments >= 2 and rebuilt.from_snapshot is None and rebuilt.lost is None
    assert uploaded_end < original[1][-1][0]  # the tail is not there: reported, not invented
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.table("default.ev")
        log = table.logs[1]
        assert (log.start_offset, log.end_offset) == (0, rebuilt.offset)
        assert _records(log) == [(o, r) for o, r in original[1] if o < rebuilt.offset]
        assert _records(table.logs[0]) == original[0]
        table.write(events(1000, 10))  # the bucket goes on from the rebuilt offset
    # A bucket directory found missing when its table opens is rebuilt the same way.
    shutil.rmtree(directory / "bucket-0")
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        log = store.table("default.ev").logs[0]
        end = log.remote.log_manifest().end_offset
        assert log.end_offset == end and _records(log) == [(o, r) for o, r in original[0] if o < end]


def test_pk_bucket_rebuilt_from_its_newest_snapshot_and_the_log_after_it(tmp_path, remote_options):
    with Store(tmp_path / "data", fsync=False, options=remote_options) as store:
        table = store.create_table("default.pk", ROWS, primary_key=["k"], options={
            "bucket.num": "1", "kv.snapshot.num-retained": "2", **TIERED})
        manager = RemoteLogManager(store, 1000)
        value = 0
        for round_ in range(3):  # three snapshots, each uploaded: two stay remotely
            for _ in range(4):
                table.write(rows([value % 13, (value + 5) % 13], [value, value + 1]))
                value += 2
            table.delete(rows([round_], [0]).select(["k"]))
            table.snapshot()
            manager.run_once()
        remote = table.logs[0].remote
        snapshots = remote.kv_manifest().snapshots
        assert [s.id for s in snapshots] == [2, 3]
        stored = remote.storage.list_dir(f"{remote.path}/kv")
        assert sorted(name.split("-")[1] for name in stored if name.startswith("snapshot-")) == ["2", "3"]
        for _ in range(6):  # the log after the newest snapshot: uploaded
            table.write(rows([value % 13], [value]))
            value += 1
        manager.run_once()
        uploaded_end = remote.log_manifest().end_offset
        table.write(rows([1, 2], [-1, -2]))  # a tail never uploaded
        newest = snapshots[-1].offset
        assert newest < uploaded_end < table.logs[0].end_offset
        changes = _records(table.logs[0])
        descriptor, directory = table.descriptor, table.directory
    shutil.rmtree(directory / "bucket-0")
    rebuilt = _rebuild(remote_options, tmp_path, descriptor, directory, 0)
    assert (rebuilt.offset, rebuilt.from_snapshot, rebuilt.snapshot_id) == (uploaded_end, newest, 3)
    assert rebuilt.lost is None and rebuilt.log_start == 0
    with Store(tmp_path / "data", fsync=False, options=remote_options) as store:
        table = store.table("default.pk")
        assert table.kvs[0].recovered_from == "kv" and table.kvs[0].applied_offset == rebuilt.offset
        assert _kv_state(table) == _fold(changes, rebuilt.offset) != _fold(changes, len(changes) + 99)
        assert _records(table.logs[0]) == [(o, r) for o, r in changes if o < rebuilt.offset]


def test_a_snapshot_beyond_the_uploaded_log_rebuilds_with_the_gap_reported(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.pk", ROWS, primary_key=["k"], options={
            "bucket.num": "1", **TIERED})
        for value in range(8):
            table.write(rows([value % 5], [value]))
        RemoteLogManager(store, 1000).run_once()
        remote = table.logs[0].remote
        uploaded_end = remote.log_manifest().end_offset
        table.write(rows([7], [70]))
        snapshot = table.snapshot()[0]
        upload_snapshots(remote, table.kvs[0].snapshots, 2)  # the snapshot only, not the log
        assert uploaded_end < snapshot.offset
        expected = _kv_state(table)
        descriptor, directory = table.descriptor, table.directory
    shutil.rmtree(directory / "bucket-0")
    rebuilt = _rebuild(local_remote, tmp_path, descriptor, directory, 0)
    assert (rebuilt.offset, rebuilt.from_snapshot) == (snapshot.offset, snapshot.offset)
    assert rebuilt.lost == (uploaded_end, snapshot.offset)
    with LogTablet(directory / "bucket-0" / "log", changelog_schema(ROWS), fsync=False) as log:
        assert log.end_offset == snapshot.offset  # the log alone already continues there
        assert log.damage() == [(uploaded_end, snapshot.offset)]
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.table("default.pk")
        assert _kv_state(table) == expected
        with pytest.raises(DataLoss, match=f"offsets {uploaded_end}..{snapshot.offset - 1} are lost"):
            list(table.logs[0].read(0))
        table.write(rows([100], [1]))
        assert table.logs[0].end_offset == snapshot.offset + 1


def test_rebuild_refuses_a_directory_that_is_not_empty(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        descriptor, directory = table.descriptor, table.directory
    with pytest.raises(InvalidInput, match="not empty"):
        _rebuild(local_remote, tmp_path, descriptor, directory, 0)
