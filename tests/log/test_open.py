"""Fast open: what opening reads does not grow with the number of records; headers load lazily
with bounded memory; timestamps are found by binary search."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.catalog import read_table_dir
from flightstore.log import LogTablet
from flightstore.log import segment as segment_module
from flightstore.log.segment import segment_name
from flightstore.store import Store
from tests.log.builder import write_records

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
BATCH = pa.record_batch({"id": list(range(10)), "v": [f"value-{i}" for i in range(10)]},
                        schema=SCHEMA)
SEGMENT = 16 * 1024 * 1024
MANY = 100_000


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[int, Path]:
    """Logs of 1,000 and 100,000 records (records of 10 rows, 16 MiB segments), closed cleanly."""
    root = tmp_path_factory.mktemp("logs")
    built = {}
    for count in (1_000, MANY):
        write_records(root / str(count), BATCH, count, segment_bytes=SEGMENT,
                      writer_every=1000)
        built[count] = root / str(count)
    return built


def _headers_parsed(tablet: LogTablet) -> int:
    return sum(s.io["headers_parsed"] for s in tablet._segments)


def test_open_reads_no_record_whatever_the_record_count(logs) -> None:
    with LogTablet(logs[1_000], SCHEMA) as small, LogTablet(logs[MANY], SCHEMA) as large:
        assert (small.end_offset, large.end_offset) == (10_000, MANY * 10)
        segments = len(large._segments)
        assert len(small._segments) == 1 and segments > 4
        assert small.open_io()["headers_parsed"] == large.open_io()["headers_parsed"] == 0
        # one summary per segment: the same bytes per segment for 1,000 or 100,000 records
        per_segment = large.open_io()["bytes_read"] / segments
        assert abs(per_segment - small.open_io()["bytes_read"]) < 64
        assert large.writer_state() == {"w": (MANY - 1) // 1000 * 1000}  # from the summaries
        assert not any(s.loaded for s in large._segments[:-1])
        # the first read of a range loads what it needs, and answers right
        rows = [r for b in large.read(654_321, to_offset=654_325) for r in b.batch.to_pylist()]
        assert rows == BATCH.slice(1, 4).to_pylist()
        assert sum(s.loaded for s in large._segments) == 1


def test_killed_writer_open_verifies_only_the_active_segment(logs, tmp_path) -> None:
    copy = tmp_path / "log"
    shutil.copytree(logs[MANY], copy)
    segments = sorted(copy.glob("*.log"))
    (copy / f"{segments[-1].stem}.summary").unlink()  # no clean close since the last roll
    with LogTablet(copy, SCHEMA) as tablet:
        last = tablet._segments[-1]
        assert 0 < tablet.open_io()["headers_parsed"] == last.records_count < MANY // 4
        assert tablet.end_offset == MANY * 10


def test_store_opens_a_100k_record_table_reading_only_summaries(logs, tmp_path) -> None:
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("big", SCHEMA)
        log_dir = read_table_dir(data_dir, "big") / "bucket-0" / "log"
    shutil.rmtree(log_dir)
    shutil.copytree(logs[MANY], log_dir)
    with Store(data_dir, fsync=False) as store:
        table = store.table("big")
        assert table.row_count() == MANY * 10
        io = table.logs[0].open_io()
        assert io["headers_parsed"] == 0
        assert io["bytes_read"] < 1024 * len(table.logs[0]._segments)


def test_headers_of_sealed_segments_are_bounded_in_memory(tmp_path, monkeypatch) -> None:
    write_records(tmp_path, BATCH, 4_000, segment_bytes=128 * 1024)
    monkeypatch.setattr(segment_module.LOADED, "limit", 500)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        sealed = tablet._segments[:-1]
        per_segment = sealed[0].records_count
        assert len(sealed) > 10 and per_segment < 500
        total = sum(b.batch.num_rows for b in tablet.read(columns=["id"]))
        assert total == 40_000
        loaded = [s for s in sealed if s.loaded]
        assert 0 < len(loaded) <= 500 // per_segment + 1  # the others were dropped
        assert segment_module.LOADED.weight <= 500 + per_segment
        # a dropped segment loads again when read
        first = sealed[0]
        assert not first.loaded
        assert [b.base_offset for b in tablet.read(0, to_offset=20)] == [0, 10]
        assert first.loaded


def test_offset_for_timestamp_is_a_binary_search_over_the_time_index(tmp_path) -> None:
    def ts(i: int) -> int:  # not monotonic: the index keeps the running maximum
        return 10_000 + i * 10 + (500 if i % 97 == 0 else 0)

    count = 3_000
    write_records(tmp_path, BATCH, count, segment_bytes=256 * 1024, timestamps=ts)
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert len(tablet._segments) > 5
        for target in (0, 10_000, 10_001, 10_500, 10_501, 25_555, 39_990, 40_500, 50_000):
            expected = next((i * 10 for i in range(count) if ts(i) >= target), tablet.end_offset)
            assert tablet.offset_for_timestamp(target) == expected, target
        assert _headers_parsed(tablet) == 0  # the index answered, no record header was read


def test_retention_with_a_floor_on_a_lazily_opened_log(tmp_path) -> None:
    write_records(tmp_path, BATCH, 2_000, segment_bytes=64 * 1024, timestamps=lambda i: i)
    with LogTablet(tmp_path, SCHEMA, ttl_ms=1) as tablet:
        bases = [s.base_offset for s in tablet._segments]
        assert len(bases) > 4
        floor = bases[3] + 5  # inside the fourth segment: it and later ones stay
        assert tablet.enforce_retention(now_ms=10**9, floor=floor) == bases[3]
        assert tablet.start_offset == bases[3]
        assert not (tmp_path / f"{segment_name(bases[0])}.summary").exists()
        assert [b.base_offset for b in tablet.read(0, to_offset=bases[3] + 10)] == [bases[3]]
        assert tablet.enforce_retention(now_ms=10**9) == bases[-1]
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert (tablet.start_offset, tablet.end_offset) == (bases[-1], 20_000)
