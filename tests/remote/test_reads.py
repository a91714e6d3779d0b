"""Reads of offsets held only in remote storage: DATA_LOSS naming a missing or corrupt remote
segment, a read in progress surviving the deletion of its local segment, the bounded download
cache, timestamps, and expiry of remote segments by ``table.log.ttl``."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.errors import DataLoss, RemoteStorageUnavailable
from flightstore.remote import RemoteLogManager
from flightstore.store import Store
from tests.remote.tables import EVENTS, ROWS, TIERED, events, rows
from tests.server.conftest import RunningServer
from tests.waiting import distinct_millisecond


def _tier(store: Store, table) -> dict:
    done = RemoteLogManager(store, 1000).run_once()
    assert all(log.local_start_offset > 0 for log in table.logs), done
    return done


def test_missing_or_corrupt_remote_segment_is_data_loss_naming_it(tmp_path, local_remote):
    server = RunningServer(tmp_path / "data", {**local_remote, "remote.log.task-interval-duration": "1h"})
    try:
        with flightstore.connect(server.uri, timeout=120) as conn:
            conn.sql("CREATE TABLE ev (seq BIGINT, s STRING) WITH ('table.log.segment.bytes' = "
                     "'1024', 'table.log.tiered.local-segments' = '1')")
            for i in range(6):
                conn.table("ev").append(events(i * 10, 10))
            table = server.store.table("default.ev")
            server.server.remote_log.run_once()
            log = table.logs[0]
            assert log.local_start_offset > 0
            first, second = log.remote.log_manifest().segments[:2]
            gone = Path(log.remote.path) / first.folder
            kept = tmp_path / "kept"
            shutil.copytree(gone, kept)
            shutil.rmtree(gone)
            for query in ("SELECT seq FROM ev", "SELECT seq FROM ev$changelog"):
                with pytest.raises(flight.FlightInternalError) as error:
                    conn.sql(query)
                message = str(error.value)
                assert message.startswith("DATA_LOSS: ") and first.folder in message, message
                assert "is missing from remote storage" in message and "bucket 0" in message
            shutil.copytree(kept, gone)
            damaged = Path(log.remote.path) / second.folder / f"{second.base_offset:020d}.log"
            data = bytearray(damaged.read_bytes())
            data[len(data) // 2] ^= 0xFF
            damaged.write_bytes(bytes(data))
            with pytest.raises(flight.FlightInternalError) as error:
                conn.sql("SELECT seq FROM ev")
            message = str(error.value)
            assert message.startswith("DATA_LOSS: ") and damaged.name in message, message
            assert second.folder in message and "fails its checksum" in message
            assert conn.sql("SELECT COUNT(*) AS n FROM ev").column("n").to_pylist() == [60]
    finally:
        server.stop()


def test_a_read_in_progress_survives_the_deletion_of_its_local_segments(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(6):
            table.write(events(i * 10, 10))
        log = table.logs[0]
        reading = log.read(0, columns=["seq"])
        first = next(reading)  # the read holds the local segments it started with
        _tier(store, table)
        assert not list(log.directory.glob(f"{0:020d}.*"))  # the first segment's files are gone
        rest = [v for batch in reading for v in batch.batch.column("seq").to_pylist()]
        assert first.batch.column("seq").to_pylist() + rest == list(range(60))


def test_the_download_cache_stays_bounded(tmp_path, local_remote):
    options = {**local_remote, "remote.log.cache-size": "3000"}
    with Store(tmp_path / "data", fsync=False, options=options) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        marks = []
        for i in range(8):
            marks.append((distinct_millisecond(), table.logs[0].end_offset))
            table.write(events(i * 10, 10))
        _tier(store, table)
        log, cache = table.logs[0], store.remote.cache
        assert table.scan_table().column("seq").to_pylist() == list(range(80))
        assert cache.downloads == len(log.remote.log_manifest().chain(log.local_start_offset))
        assert 0 < cache.bytes <= 3000
        assert len(list(cache.directory.iterdir())) < cache.downloads
        # A timestamp whose record is remote finds its offset there.
        ms, offset = marks[1]
        assert offset < log.local_start_offset and log.offset_for_timestamp(ms) == offset


def test_remote_segments_expire_with_the_log_ttl(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={
            "bucket.num": "1", "table.log.ttl": "1h", **TIERED})
        for i in range(6):
            table.write(events(i * 10, 10))
        _tier(store, table)
        log = table.logs[0]
        uploaded = log.remote.log_manifest().segments
        folders = [Path(log.remote.path) / s.folder for s in uploaded]
        assert log.start_offset == 0 and all(f.is_dir() for f in folders)
        assert table.enforce_retention(now_ms=int(time.time() * 1000)) == 0  # nothing expired yet
        dropped = table.enforce_retention(now_ms=int(time.time() * 1000) + 2 * 3_600_000)
        assert not log.remote.log_manifest().segments and not any(f.exists() for f in folders)
        assert log.start_offset == log.local_start_offset == dropped > 0
        assert table.scan_table().num_rows == 60 - dropped


def test_a_writer_whose_segments_left_local_disk_stays_idempotent(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for sequence in range(3):
            table.append(events(sequence * 10, 10), writer_id="early", sequence=sequence)
        for i in range(3, 8):
            table.append(events(i * 10, 10))
        _tier(store, table)
        assert "early" not in {w for s in table.logs[0].sealed_segments() for w in s.writers}
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.table("default.ev")
        assert table.writer_sequence("early") == 2
        assert table.append(events(20, 10), writer_id="early", sequence=2).duplicate  # a retry
        assert not table.append(events(80, 10), writer_id="early", sequence=3).duplicate
        assert table.scan_table().column("seq").to_pylist() == list(range(90))


def test_a_pk_full_scan_reads_no_remote_segment(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.pk", ROWS, primary_key=["k"], options={
            "bucket.num": "1", **TIERED})
        for value in range(4):
            table.write(rows([value % 3], [value]))
        table.snapshot()
        for value in range(4, 10):
            table.write(rows([value % 3], [value]))
        _tier(store, table)
        expected = {0: 9, 1: 7, 2: 8}
        for exact in (True, False):  # the image path and the whole-changelog path
            got = pa.Table.from_batches(list(table.kvs[0].full_scan(exact=exact)), schema=ROWS)
            assert {r["k"]: r["v"] for r in got.to_pylist()} == expected
        assert store.remote.cache.downloads == 0  # RocksDB answered: nothing downloaded


def test_while_remote_storage_is_down_tables_open_and_only_old_offsets_wait(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        ev = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        pk = store.create_table("default.pk", ROWS, primary_key=["k"], options={
            "bucket.num": "1", **TIERED})
        for i in range(6):
            ev.write(events(i * 10, 10))
            pk.write(rows([i % 4], [i]))
        RemoteLogManager(store, 1000).run_once()
        assert ev.logs[0].local_start_offset > 0 and pk.logs[0].local_start_offset > 0
    remote = Path(local_remote["remote.data.dir"])
    remote.rename(tmp_path / "away")
    remote.symlink_to(remote)  # a loop: every access fails (an I/O error, like a storage outage)
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        ev, pk = store.table("default.ev"), store.table("default.pk")  # both open
        ev.write(events(60, 10))
        pk.write(rows([9], [9]))
        assert {r["k"]: r["v"] for r in pk.scan_table().to_pylist()} == {0: 4, 1: 5, 2: 2, 3: 3, 9: 9}
        log = ev.logs[0]
        assert [v for b in log.read(log.local_start_offset) for v in b.batch.column("seq").to_pylist()][-1] == 69
        with pytest.raises(RemoteStorageUnavailable):
            ev.scan_table()
        remote.unlink()
        (tmp_path / "away").rename(remote)
        assert ev.scan_table().column("seq").to_pylist() == list(range(70))


def test_remote_storage_that_lost_the_uploads_is_data_loss_not_an_empty_history(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        ev = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(6):
            ev.write(events(i * 10, 10))
        _tier(store, ev)
    shutil.rmtree(local_remote["remote.data.dir"])  # wiped (or another remote.data.dir)
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        ev = store.table("default.ev")
        with pytest.raises(DataLoss, match="remote storage holds no manifest at .* but this bucket "
                                           "wrote version 1 there"):
            ev.scan_table()
        log = ev.logs[0]
        assert [v for b in log.read(log.local_start_offset) for v in b.batch.column("seq").to_pylist()] \
            == list(range(log.local_start_offset, 60))
        assert RemoteLogManager(store, 1000).run_once()["segments"] == 0  # nothing uploaded there
