"""Segment files: record format, offset index, torn tails cut, corruption kept and reported."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.errors import DataLoss
from flightstore.log import LogTablet
from flightstore.log.index import INDEX_ENTRY
from flightstore.log.record import HEADER
from flightstore.log.segment import segment_name
from flightstore.log.walk import walk_records

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, start + n)),
                            "name": [f"row-{i}" for i in range(start, start + n)]}, schema=SCHEMA)


def _write_three(directory: Path) -> Path:
    """Three records of 10, 20, 30 rows in one segment; returns the segment path."""
    with LogTablet(directory, SCHEMA, fsync=False) as tablet:
        tablet.append(_batch(0, 10))
        tablet.append(_batch(10, 20))
        tablet.append(_batch(30, 30))
    return directory / f"{segment_name(0)}.log"


def _crashed(directory: Path) -> None:
    """Forget the checkpoints of clean closes: the state a writer killed mid-way leaves."""
    for summary in directory.glob("*.summary"):
        summary.unlink()


def _ids(tablet: LogTablet, *args, **kwargs) -> list[int]:
    return [i for b in tablet.read(*args, **kwargs) for i in b.batch.column("id").to_pylist()]


def _record_starts(path: Path) -> list[int]:
    with open(path, "rb") as handle:
        fd = handle.fileno()
        walk = walk_records(lambda n, p: os.pread(fd, n, p), os.fstat(fd).st_size, 0, 0, True)
    return [record.position for record in walk.records]


def _flip(path: Path, position: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def test_segment_file_names_and_index_entries(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    assert path.name == "00000000000000000000.log"
    index = (tmp_path / "00000000000000000000.index").read_bytes()
    entries = [INDEX_ENTRY.unpack_from(index, i) for i in range(0, len(index), INDEX_ENTRY.size)]
    assert [base for base, _, _ in entries] == [0, 10, 30]
    assert entries[0][1] == 0
    assert path.read_bytes()[entries[1][1]:entries[1][1] + 4] == b"FSLB"
    assert (tmp_path / "00000000000000000000.summary").exists()


@pytest.mark.parametrize("cut", ["mid_payload", "mid_header", "one_byte"])
def test_torn_tail_of_a_crashed_writer_is_cut_at_last_good_record(tmp_path: Path, cut: str) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    size = path.stat().st_size
    new_size = {"mid_payload": size - 100, "mid_header": starts[2] + HEADER.size // 2,
                "one_byte": size - 1}[cut]
    os.truncate(path, new_size)
    _crashed(tmp_path)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 30
        assert path.stat().st_size == starts[2]
        assert _ids(tablet) == list(range(30))
        assert tablet.append(_batch(100, 5)) == 30
    # the cut bytes are kept aside, not destroyed
    [kept] = (tmp_path / "quarantine").iterdir()
    assert kept.stat().st_size == new_size - starts[2]
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet) == list(range(30)) + list(range(100, 105))
        assert [b.base_offset for b in tablet.read()] == [0, 10, 30]


def test_truncation_below_a_clean_close_keeps_offsets_and_reports_the_loss(tmp_path: Path) -> None:
    """The last 100 bytes of a cleanly closed log vanish: the offsets they held are not reused,
    reads that need them raise DataLoss, the rest stays readable."""
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    os.truncate(path, path.stat().st_size - 100)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 60
        assert tablet.damage() == [(30, 60)]
        assert path.stat().st_size == starts[2]
        assert _ids(tablet, 0, to_offset=30) == list(range(30))
        with pytest.raises(DataLoss, match=r"offsets 30\.\.59 are lost"):
            _ids(tablet)
        assert tablet.append(_batch(100, 5)) == 60
        assert _ids(tablet, 60) == list(range(100, 105))
    with LogTablet(tmp_path, SCHEMA) as tablet:  # the hole is remembered across restarts
        assert (tablet.end_offset, tablet.damage()) == (65, [(30, 60)])
        with pytest.raises(DataLoss):
            _ids(tablet, 25, to_offset=35)


def test_garbage_after_last_record_is_cut(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"FSLB" + os.urandom(200))
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert path.stat().st_size == size
        assert tablet.end_offset == 60
        assert tablet.append(_batch(60, 1)) == 60
        assert _ids(tablet) == list(range(61))


def test_flipped_payload_byte_in_last_record_of_a_crashed_writer_is_a_torn_tail(
        tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    _flip(path, path.stat().st_size - 50)
    _crashed(tmp_path)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 30
        assert path.stat().st_size == starts[2]
        assert tablet.append(_batch(200, 3)) == 30
        assert _ids(tablet) == list(range(30)) + [200, 201, 202]


@pytest.mark.parametrize("column", ["id", "name"])
def test_flipped_payload_byte_of_a_checkpointed_record_raises_data_loss_on_read(
        tmp_path: Path, column: str) -> None:
    """Not re-checked at open; the read that decodes the bad column refuses to answer."""
    with LogTablet(tmp_path, SCHEMA, fsync=False) as tablet:
        tablet.append(_batch(0, 10))
        tablet.append(pa.record_batch({"id": [7] * 1000, "name": ["x" * 50] * 1000},
                                      schema=SCHEMA))
        tablet.append(_batch(20, 10))
        [reference] = [b.batch for b in tablet.read(10, to_offset=1010)]
    path = tmp_path / f"{segment_name(0)}.log"
    payload = path.read_bytes()
    # the column's data buffer (the statistics in the header hold "x" * 50 too: search from the end)
    position = payload.rindex(b"x" * 50) if column == "name" else payload.rindex(
        (7).to_bytes(8, "little") * 50)
    _flip(path, position - 20, 0x01)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 1020
        assert _ids(tablet, 0, to_offset=10) == list(range(10))
        assert _ids(tablet, 1010) == list(range(20, 30))
        with pytest.raises(DataLoss, match=r"offsets 10\.\.1009 are unreadable"):
            list(tablet.read(columns=[column]))
        other = "name" if column == "id" else "id"  # a column-pruned read of a good column works
        got = pa.Table.from_batches([b.batch for b in tablet.read(10, columns=[other],
                                                                  to_offset=1010)])
        assert got.column(other).to_pylist() == reference.column(other).to_pylist()


def test_bad_record_followed_by_valid_ones_is_corruption_nothing_valid_is_deleted(
        tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    size = path.stat().st_size
    _flip(path, starts[1] + 12, 0x01)  # inside the base offset of the second record
    _crashed(tmp_path)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert path.stat().st_size == size  # nothing cut
        assert tablet.end_offset == 60
        assert tablet.damage() == [(10, 30)]
        assert _ids(tablet, 0, to_offset=10) == list(range(10))
        assert _ids(tablet, 30) == list(range(30, 60))
        with pytest.raises(DataLoss, match=r"offsets 10\.\.29 are lost"):
            _ids(tablet)
        assert tablet.append(_batch(60, 2)) == 60
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet, 30) == list(range(30, 60)) + [60, 61]


def test_bad_header_of_a_checkpointed_record_raises_data_loss_on_read(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    _flip(path, starts[1] + 12, 0x01)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 60
        assert _ids(tablet, 30) == list(range(30, 60))
        with pytest.raises(DataLoss, match=r"offsets 10\.\.29 are lost"):
            _ids(tablet)


@pytest.mark.parametrize("crashed", [False, True])
def test_corrupt_sealed_segment_is_reported_by_reads_not_at_open(tmp_path: Path,
                                                                  crashed: bool) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=1, fsync=False) as tablet:
        for i in range(3):
            tablet.append(_batch(i * 10, 10))
    first = tmp_path / f"{segment_name(0)}.log"
    data = bytearray(first.read_bytes())
    data[0:4] = b"XXXX"
    first.write_bytes(bytes(data))
    if crashed:
        _crashed(tmp_path)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert (tablet.start_offset, tablet.end_offset) == (0, 30)
        assert _ids(tablet, 10) == list(range(10, 30))
        with pytest.raises(DataLoss, match=r"offsets 0\.\.9"):
            _ids(tablet)


def test_missing_or_wrong_index_is_rebuilt(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    index = tmp_path / f"{segment_name(0)}.index"
    good = index.read_bytes()
    index.unlink()
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet) == list(range(60))
    assert index.read_bytes() == good
    index.write_bytes(b"\x00" * 7)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert [b.base_offset for b in tablet.read(35)] == [30]
    assert index.read_bytes() == good
    index.write_bytes(b"\x01" * len(good))  # right size, wrong content: caught by its CRC
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert [b.base_offset for b in tablet.read(35)] == [30]
        tablet.append(_batch(60, 1))
    assert index.read_bytes()[:len(good)] == good
    assert path.exists()
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet) == list(range(61))


def test_empty_segment_after_crash_on_roll_is_reused(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        tablet.append(_batch(0, 4))
    (tmp_path / f"{segment_name(4)}.log").write_bytes(b"")  # crash right after creating it
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 4
        assert tablet.append(_batch(4, 2)) == 4
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet) == list(range(6))


def test_statistics_cover_chosen_columns_and_skip_long_strings() -> None:
    from flightstore.log.record import compute_statistics, statistics_from_json
    batch = pa.record_batch({"id": [3, None, 1], "name": ["b", "a", "x" * 1000]}, schema=SCHEMA)
    stats = statistics_from_json(compute_statistics(batch, ["id", "name"]))
    assert set(stats) == {"id"}
    assert (stats["id"].min, stats["id"].max, stats["id"].null_count, stats["id"].row_count) == (
        1, 3, 1, 3)


def test_decoded_records_are_reused_and_bounded(tmp_path: Path, monkeypatch) -> None:
    import flightstore.log.payload as payload_module

    monkeypatch.setattr(payload_module, "DECODED_RECORDS_PER_SEGMENT", 2)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        for start in range(0, 40, 10):
            tablet.append(_batch(start, 10))
        first = _ids(tablet)
        segment = tablet._segments[0]._payloads
        assert len(segment._decoded) == 2  # bounded: the two latest records
        assert _ids(tablet) == first == list(range(40))
        names = [n for b in tablet.read(columns=["name"]) for n in b.batch.column("name").to_pylist()]
        assert names == [f"row-{i}" for i in range(40)]
        # appends after a cached read are seen; the cache never serves another record's rows
        tablet.append(_batch(40, 5))
        assert _ids(tablet) == list(range(45))
    assert segment._decoded == {}  # closing drops the decoded views
