"""Lake files are checked before they are read (issue 20, item 4): page checksums and a whole-file
CRC recorded at commit; a damaged file is DATA_LOSS naming it, never a changed value; a union read
answers a damaged file's bucket from the log while the log still holds its rows; ``flightstore
verify`` checks the lake files."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flightstore
from flightstore.errors import DataLoss
from flightstore.lake import LakeSettings, LakeTierer, read_lake
from flightstore.lake.integrity import ChecksumStore, key_path
from flightstore.lake.union import read_union
from flightstore.maintenance import verify
from flightstore.sql.execute import Executor
from flightstore.store import Store
from tests.lake.conftest import LakeServer, create_events, events

FAR_FUTURE_MS = 2**62
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def uncached(data_dir):
    """A tierer whose catalog has no read cache: every read decodes the Parquet files."""
    settings = LakeSettings.from_options(data_dir, {"datalake.read-cache.size": "0"})
    return settings


def _tiered(store: Store, settings: LakeSettings, rows: int = 300, **options):
    table = create_events(store, **options)
    for first in range(0, rows, 100):
        table.append(events(first, 100))
    tierer = LakeTierer(store, settings)
    assert tierer.tier_now(table.path).committed
    return table, tierer


def _files(tierer, table) -> list[Path]:
    lake_table = tierer.catalog.load_table(table.path)
    return [Path(key_path(lake_table.io, t.file.file_path)) for t in lake_table.scan().plan_files()]


def _union_seqs(catalog, table) -> list[int]:
    rows = pa.Table.from_batches(list(read_union(catalog, table, ["seq"])), schema=pa.schema([("seq", pa.int64())]))
    return sorted(rows.column("seq").to_pylist())


def test_every_single_bit_flip_is_data_loss_naming_the_file_never_a_changed_value(store, uncached):
    """(a) Flips at seeded random positions of a tiered file, no read cache: t$lake and a union
    read whose log no longer holds the rows either answer the right rows or fail with DATA_LOSS
    naming the file."""
    table, tierer = _tiered(store, uncached, table_log_ttl="1ms", table_log_segment_bytes=2048)
    try:
        assert store.enforce_retention(FAR_FUTURE_MS) > 0  # the log lost the tiered rows' start
        assert all(log.start_offset > 0 for log in table.logs)
        expected_lake = read_lake(tierer.catalog, table.descriptor, columns=["seq", "s"]).sort_by("seq")
        expected_union = _union_seqs(tierer.catalog, table)
        assert expected_union == list(range(300))
        target = _files(tierer, table)[0]
        original = target.read_bytes()
        rng = random.Random(20)
        failures = 0
        for _ in range(80):
            damaged = bytearray(original)
            position = rng.randrange(len(damaged))
            damaged[position] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(damaged))
            for read in (lambda: read_lake(tierer.catalog, table.descriptor, columns=["seq", "s"]).sort_by("seq"),
                         lambda: _union_seqs(tierer.catalog, table)):
                try:
                    got = read()
                except DataLoss as exc:
                    assert target.name in str(exc), str(exc)
                    failures += 1
                    continue
                assert got == (expected_lake if isinstance(got, pa.Table) else expected_union), position
        target.write_bytes(original)
        assert failures == 160  # the whole-file CRC catches every single-bit flip
        assert _union_seqs(tierer.catalog, table) == expected_union
    finally:
        tierer.stop()


def test_parquet_files_carry_page_checksums(store, uncached):
    """A flip inside a data page fails Arrow's page checksum verification (files written without
    page checksums would decode it silently)."""
    table, tierer = _tiered(store, uncached)
    tierer.stop()
    target = _files(tierer, table)[0]
    column = pq.ParquetFile(target).metadata.row_group(0).column(1)  # seq
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data = bytearray(target.read_bytes())
    data[start + column.total_compressed_size - 3] ^= 0x10  # in the chunk's last page, past its header
    target.write_bytes(bytes(data))
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(target, columns=["seq"], page_checksum_verification=True)


def test_every_file_is_recorded_with_its_size_and_crc_at_commit(store, uncached):
    table, tierer = _tiered(store, uncached)
    try:
        lake_table = tierer.catalog.load_table(table.path)
        files = _files(tierer, table)
        checks = ChecksumStore.of(lake_table).lookup([str(f) for f in files])
        assert sorted(checks) == sorted(str(f) for f in files)
        for path in files:
            import zlib
            data = path.read_bytes()
            assert (checks[str(path)].size, checks[str(path)].crc32) == (len(data), zlib.crc32(data))
    finally:
        tierer.stop()


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_file_is_answered_from_the_log_while_it_holds_the_rows(
        store, uncached, damage):
    """(b) The union read returns every row once and reports the file (t$lake$status); once
    retention deleted the rows from the log: DATA_LOSS naming the file."""
    table, tierer = _tiered(store, uncached, table_log_ttl="1ms", table_log_segment_bytes=2048)
    try:
        table.append(events(300, 30))  # a log tail above the tiered offsets
        sql = Executor(store, tierer.catalog, tierer)
        target = _files(tierer, table)[1]
        original = target.read_bytes()

        def damage_it() -> None:
            if damage == "missing":
                target.unlink()
            else:
                target.write_bytes(original[:-100])

        def damaged_files() -> dict:
            status = sql.execute_table(sql.plan("SELECT bucket, damaged_files FROM events$lake$status"))
            return {r["bucket"]: r["damaged_files"] for r in status.to_pylist() if r["damaged_files"]}

        damage_it()
        assert _union_seqs(tierer.catalog, table) == list(range(330))
        got = sql.execute_table(sql.plan("SELECT seq FROM events ORDER BY seq"))
        assert got.column("seq").to_pylist() == list(range(330))
        reported = damaged_files()
        assert len(reported) == 1 and target.name in reported.popitem()[1][0]
        target.write_bytes(original)  # restored (from a backup): the next read finds it whole
        assert _union_seqs(tierer.catalog, table) == list(range(330)) and damaged_files() == {}
        damage_it()
        with pytest.raises(DataLoss, match=target.name):
            read_lake(tierer.catalog, table.descriptor)  # the lake alone cannot answer
        # Retention deletes the tiered records from the log: nothing can answer that bucket now.
        assert store.enforce_retention(FAR_FUTURE_MS) > 0
        with pytest.raises(DataLoss, match=target.name):
            _union_seqs(tierer.catalog, table)
    finally:
        tierer.stop()


def test_over_flight_the_client_gets_data_loss_naming_the_file(data_dir, uncached):
    with Store(data_dir) as store:
        table, tierer = _tiered(store, uncached, table_log_ttl="1ms", table_log_segment_bytes=2048)
        tierer.stop()
        assert store.enforce_retention(FAR_FUTURE_MS) > 0
        target = _files(tierer, table)[2]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x04
    target.write_bytes(bytes(data))
    running = LakeServer(data_dir, LakeSettings.from_options(data_dir, {"datalake.read-cache.size": "0",
                                                                        "datalake.tiering.enabled": "false"}))
    try:
        with flightstore.connect(running.uri, timeout=60) as conn:
            with pytest.raises(Exception, match=f"DATA_LOSS: .*{target.name}.* is corrupt"):
                conn.sql("SELECT seq FROM events")
            assert conn.sql("SELECT COUNT(*) AS n FROM events").column("n").to_pylist() == [300]
    finally:
        running.stop()


def _verify(data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightstore", "verify", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_verify_checks_the_lake_files(data_dir, uncached):
    """(c) ``flightstore verify`` exits 1 naming a corrupt, a truncated and a missing lake file."""
    with Store(data_dir) as store:
        table, tierer = _tiered(store, uncached)
        table.append(events(300, 100))
        assert tierer.tier_now(table.path).committed  # a second snapshot: files of both are checked
        tierer.stop()
        files = _files(tierer, table)
    clean = verify(data_dir)
    assert clean.ok and not [f for f in clean.findings if "lake" in f.where], clean.findings
    corrupt, truncated, missing = files[0], files[1], files[2]
    data = bytearray(corrupt.read_bytes())
    data[7] ^= 0x01
    corrupt.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-1])
    missing.unlink()
    found = _verify(data_dir)
    assert found.returncode == 1, found.stdout + found.stderr
    assert f"{corrupt.name} is corrupt" in found.stdout
    assert f"{truncated.name} is truncated" in found.stdout
    assert f"{missing.name} is missing" in found.stdout


def test_a_spark_lake_split_checks_its_files_before_decoding_them(store, uncached):
    """The server's plan of a union read gives each file's size and CRC; an executor reading a
    lake split checks them (read_data_files) and fails with DATA_LOSS naming a damaged file."""
    from flightstore.lake.files import read_data_files
    from flightstore.lake.layout import lake_schema
    from flightstore.lake.union import plan_split

    table, tierer = _tiered(store, uncached)
    try:
        planned = plan_split(tierer.catalog, table)
        files = planned["files"]
        assert len(files) == 3 and all(f["crc32"] is not None and f["bytes"] > 0 for f in files)
        schema = lake_schema(table.descriptor)
        whole = pa.Table.from_batches(list(read_data_files(files, {}, schema, ["seq"])))
        assert sorted(whole.column("seq").to_pylist()) == list(range(300))
        target = Path(key_path(tierer.catalog.load_table(table.path).io, files[0]["path"]))
        data = bytearray(target.read_bytes())
        data[len(data) // 3] ^= 0x20
        target.write_bytes(bytes(data))
        with pytest.raises(DataLoss, match=f"{target.name} is corrupt"):
            list(read_data_files(files, {}, schema, ["seq"]))
    finally:
        tierer.stop()
