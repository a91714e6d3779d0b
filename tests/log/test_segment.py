"""Segment files: record format, offset index, and tail recovery after torn writes."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.errors import CorruptData
from flightstore.log import LogTablet
from flightstore.log.segment import HEADER, INDEX_ENTRY, Segment, segment_name

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, start + n)),
                            "name": [f"row-{i}" for i in range(start, start + n)]}, schema=SCHEMA)


def _write_three(directory: Path) -> Path:
    """Three records of 10, 20, 30 rows in one segment; returns the segment path."""
    with LogTablet(directory, SCHEMA) as tablet:
        tablet.append(_batch(0, 10))
        tablet.append(_batch(10, 20))
        tablet.append(_batch(30, 30))
    return directory / f"{segment_name(0)}.log"


def _ids(tablet: LogTablet) -> list[int]:
    return [i for b in tablet.read() for i in b.batch.column("id").to_pylist()]


def _record_starts(path: Path) -> list[int]:
    return [Segment.load(path.parent, 0, verify=False).records[i].position for i in range(3)]


def test_segment_file_names_and_index_entries(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    assert path.name == "00000000000000000000.log"
    index = (tmp_path / "00000000000000000000.index").read_bytes()
    entries = [INDEX_ENTRY.unpack_from(index, i) for i in range(0, len(index), INDEX_ENTRY.size)]
    assert [base for base, _ in entries] == [0, 10, 30]
    assert entries[0][1] == 0
    assert path.read_bytes()[entries[1][1]:entries[1][1] + 4] == b"FSLB"


@pytest.mark.parametrize("cut", ["mid_payload", "mid_header", "one_byte"])
def test_truncated_tail_is_cut_at_last_good_record(tmp_path: Path, cut: str) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    size = path.stat().st_size
    new_size = {"mid_payload": size - 100, "mid_header": starts[2] + HEADER.size // 2,
                "one_byte": size - 1}[cut]
    os.truncate(path, new_size)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 30
        assert path.stat().st_size == starts[2]
        assert _ids(tablet) == list(range(30))
        assert tablet.append(_batch(100, 5)) == 30
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert _ids(tablet) == list(range(30)) + list(range(100, 105))
        assert [b.base_offset for b in tablet.read()] == [0, 10, 30]


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


def test_flipped_payload_byte_in_last_record_is_cut(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF
    path.write_bytes(bytes(data))
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 30
        assert path.stat().st_size == starts[2]
        assert tablet.append(_batch(200, 3)) == 30
        assert _ids(tablet) == list(range(30)) + [200, 201, 202]


def test_flipped_header_byte_cuts_from_that_record(tmp_path: Path) -> None:
    path = _write_three(tmp_path)
    starts = _record_starts(path)
    data = bytearray(path.read_bytes())
    data[starts[1] + 12] ^= 0x01  # inside the base offset of the second record
    path.write_bytes(bytes(data))
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 10
        assert _ids(tablet) == list(range(10))


def test_earlier_segments_are_trusted_but_checked(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=1) as tablet:
        for i in range(3):
            tablet.append(_batch(i * 10, 10))
    first = tmp_path / f"{segment_name(0)}.log"
    data = bytearray(first.read_bytes())
    data[0:4] = b"XXXX"
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptData):
        LogTablet(tmp_path, SCHEMA)


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
    assert path.exists()


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
    from flightstore.log.segment import compute_statistics, statistics_from_json
    batch = pa.record_batch({"id": [3, None, 1], "name": ["b", "a", "x" * 1000]}, schema=SCHEMA)
    stats = statistics_from_json(compute_statistics(batch, ["id", "name"]))
    assert set(stats) == {"id"}
    assert (stats["id"].min, stats["id"].max, stats["id"].null_count, stats["id"].row_count) == (
        1, 3, 1, 3)


def test_decoded_records_are_reused_and_bounded(tmp_path: Path, monkeypatch) -> None:
    import flightstore.log.segment as segment_module

    monkeypatch.setattr(segment_module, "DECODED_RECORDS_PER_SEGMENT", 2)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        for start in range(0, 40, 10):
            tablet.append(_batch(start, 10))
        first = _ids(tablet)
        segment = tablet._segments[0]
        assert len(segment._decoded) == 2  # bounded: the two latest records
        assert _ids(tablet) == first == list(range(40))
        names = [n for b in tablet.read(columns=["name"]) for n in b.batch.column("name").to_pylist()]
        assert names == [f"row-{i}" for i in range(40)]
        # appends after a cached read are seen; the cache never serves another record's rows
        tablet.append(_batch(40, 5))
        assert _ids(tablet) == list(range(45))
    assert segment._decoded == {}  # closing drops the decoded views
