"""LogTablet: offsets, reads with column and filter pushdown, rolling, retention, writers."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightstore.errors import InvalidInput, SchemaMismatch
from flightstore.expressions import Comparison, In
from flightstore.log import LogTablet
from flightstore.log.segment import segment_name

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch({"id": ids, "name": [f"n{i}" for i in ids], "score": ids * 0.5},
                           schema=SCHEMA)


def _table(tablet: LogTablet, **kwargs) -> pa.Table:
    return pa.Table.from_batches([b.batch for b in tablet.read(**kwargs)])


def test_append_read_round_trip_with_offsets(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert (tablet.start_offset, tablet.end_offset) == (0, 0)
        assert tablet.append(_batch(0, 5), timestamp_ms=1000) == 0
        assert tablet.append(_batch(5, 3), timestamp_ms=2000) == 5
        assert tablet.end_offset == 8
        batches = list(tablet.read())
        assert [(b.base_offset, b.next_offset, b.timestamp_ms) for b in batches] == [
            (0, 5, 1000), (5, 8, 2000)]
        assert batches[1].row_offsets.to_pylist() == [5, 6, 7]
        assert batches[1].row_offsets.type == pa.int64()
        assert pa.Table.from_batches([b.batch for b in batches]).equals(
            pa.Table.from_batches([_batch(0, 8)]))


def test_table_with_many_chunks_is_one_record(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        table = pa.Table.from_batches([_batch(0, 3), _batch(3, 4)])
        assert tablet.append(table) == 0
        assert tablet.append(pa.Table.from_batches([], schema=SCHEMA)) == 7  # empty: no record
        assert tablet.append(_batch(0, 0)) == 7
        [record] = list(tablet.read())
        assert (record.base_offset, record.next_offset, record.batch.num_rows) == (0, 7, 7)


def test_read_from_mid_record_offset_slices(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        tablet.append(_batch(0, 10))
        tablet.append(_batch(10, 10))
        batches = list(tablet.read(7))
        assert [b.base_offset for b in batches] == [0, 10]
        assert batches[0].batch.column("id").to_pylist() == [7, 8, 9]
        assert batches[0].row_offsets.to_pylist() == [7, 8, 9]
        [only] = list(tablet.read(12, to_offset=15))
        assert only.batch.column("id").to_pylist() == [12, 13, 14]
        assert list(tablet.read(20)) == []
        assert list(tablet.read(8, to_offset=3)) == []


def test_rolls_segments_and_reads_across_them(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=4096) as tablet:
        for i in range(30):
            tablet.append(_batch(i * 20, 20))
        segments = sorted(tmp_path.glob("*.log"))
        assert len(segments) > 3
        assert segments[1].name == f"{segment_name(int(segments[1].stem))}.log"
        assert all(int(p.stem) % 20 == 0 for p in segments)
        assert _table(tablet).column("id").to_pylist() == list(range(600))
        middle = int(segments[2].stem) + 5
        got = _table(tablet, from_offset=middle, to_offset=middle + 100)
        assert got.column("id").to_pylist() == list(range(middle, middle + 100))


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=4096, statistics_columns=["id"]) as tablet:
        for i in range(10):
            tablet.append(_batch(i * 20, 20), timestamp_ms=1000 + i)
        before = [(b.base_offset, b.timestamp_ms, b.batch) for b in tablet.read()]
    with LogTablet(tmp_path, SCHEMA, segment_bytes=4096, statistics_columns=["id"]) as tablet:
        assert tablet.end_offset == 200
        after = [(b.base_offset, b.timestamp_ms, b.batch) for b in tablet.read()]
        assert [a[:2] for a in after] == [b[:2] for b in before]
        assert all(a[2].equals(b[2]) for a, b in zip(after, before))
        assert tablet.append(_batch(200, 1)) == 200
        filtered = list(tablet.read(filter=Comparison("id", ">=", 190).bind(SCHEMA)))
        assert [b.base_offset for b in filtered] == [180, 200]  # statistics survive reopen


def test_column_pruned_read_reads_only_those_columns(tmp_path: Path) -> None:
    names = [f"c{i}" for i in range(100)]
    schema = pa.schema([(n, pa.float64()) for n in names])
    rng = np.random.default_rng(0)
    with LogTablet(tmp_path, schema) as tablet:
        for _ in range(4):
            tablet.append(pa.record_batch([rng.random(5000) for _ in names], schema=schema))
        full = _table(tablet)
        full_bytes = tablet.io_stats()["bytes_read"]
        wanted = ["c50", "c3", "c97", "c10", "c11", "c12", "c13", "c70", "c71", "c0"]
        pruned = _table(tablet, columns=wanted)
        pruned_bytes = tablet.io_stats()["bytes_read"] - full_bytes
        assert pruned.column_names == wanted
        assert pruned.equals(full.select(wanted))
        assert pruned_bytes / full_bytes < 0.2
        assert pruned_bytes / full_bytes > 0.05


def test_filter_skips_records_by_statistics_and_filters_rows_exactly(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, statistics_columns=["id", "name"]) as tablet:
        for i in range(20):
            tablet.append(_batch(i * 100, 100))
        everything = _table(tablet)
        base = tablet.io_stats()
        predicate = (Comparison("id", ">=", 1050) & Comparison("id", "<", 1230)).bind(SCHEMA)
        batches = list(tablet.read(columns=["name"], filter=predicate))
        stats = tablet.io_stats()
        assert stats["records_read"] - base["records_read"] == 3  # records 1000, 1100, 1200
        assert stats["records_skipped"] - base["records_skipped"] == 17
        assert stats["bytes_read"] - base["bytes_read"] < base["bytes_read"] * 0.2
        got = pa.Table.from_batches([b.batch for b in batches])
        expected = everything.filter(predicate.to_arrow())
        assert got.column_names == ["name"]
        assert got.column("name").equals(expected.column("name"))
        offsets = np.concatenate([b.row_offsets.to_numpy() for b in batches])
        assert offsets.tolist() == expected.column("id").to_pylist()  # id == offset here
        in_list = In("id", (5, 1999, 7777)).bind(SCHEMA)
        assert [b.row_offsets.to_pylist() for b in tablet.read(filter=in_list)] == [[5], [1999]]


def test_inexact_read_skips_by_statistics_only(tmp_path: Path) -> None:
    """``exact=False`` (residual SQL filters again): ruled-out records are skipped, the others
    come whole, without reading the filter's columns."""
    with LogTablet(tmp_path, SCHEMA, statistics_columns=["id"]) as tablet:
        for i in range(20):
            tablet.append(_batch(i * 100, 100))
        predicate = (Comparison("id", ">=", 1050) & Comparison("id", "<", 1230)).bind(SCHEMA)
        base = tablet.io_stats()
        batches = list(tablet.read(columns=["name"], filter=predicate, exact=False))
        stats = tablet.io_stats()
        assert stats["records_skipped"] - base["records_skipped"] == 17
        assert [b.batch.num_rows for b in batches] == [100, 100, 100]
        assert [b.batch.column_names for b in batches] == [["name"]] * 3
        assert [b.row_offsets.to_pylist() for b in batches] == \
            [list(range(s, s + 100)) for s in (1000, 1100, 1200)]


def test_filter_without_statistics_still_exact(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        tablet.append(_batch(0, 50))
        predicate = Comparison("score", ">", 20.0).bind(SCHEMA)
        [batch] = list(tablet.read(5, filter=predicate, columns=["id"]))
        assert batch.batch.column("id").to_pylist() == list(range(41, 50))
        assert batch.row_offsets.to_pylist() == list(range(41, 50))


@pytest.mark.parametrize("compression", ["NONE", "LZ4_FRAME", "ZSTD"])
def test_compression_round_trips(tmp_path: Path, compression: str) -> None:
    with LogTablet(tmp_path, SCHEMA, compression=compression) as tablet:
        tablet.append(pa.Table.from_batches([_batch(0, 2000)]))
        tablet.append(_batch(2000, 10))
    with LogTablet(tmp_path, SCHEMA, compression=compression) as tablet:
        assert _table(tablet).equals(pa.Table.from_batches([_batch(0, 2010)]))
        assert _table(tablet, columns=["score"]).column("score").equals(
            pa.chunked_array([_batch(0, 2010).column("score")]))
    size = sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    if compression != "NONE":
        with LogTablet(tmp_path / "plain", SCHEMA) as plain:
            plain.append(pa.Table.from_batches([_batch(0, 2000)]))
            plain.append(_batch(2000, 10))
        assert size < sum(p.stat().st_size for p in (tmp_path / "plain").glob("*.log"))


def test_unknown_compression_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        LogTablet(tmp_path, SCHEMA, compression="SNAPPY")


def test_max_rows_and_max_bytes_stop_after_crossing_record(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        for i in range(5):
            tablet.append(_batch(i * 10, 10))
        assert [b.base_offset for b in tablet.read(max_rows=15)] == [0, 10]
        assert [b.base_offset for b in tablet.read(max_rows=1)] == [0]
        assert [b.base_offset for b in tablet.read(5, max_bytes=1)] == [0]


def test_retention_deletes_old_closed_segments_only(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=1, ttl_ms=1000) as tablet:
        for i, ts in enumerate([100, 200, 5000, 300]):  # one record per segment
            tablet.append(_batch(i * 10, 10), timestamp_ms=ts)
        assert len(list(tmp_path.glob("*.log"))) == 4
        assert tablet.enforce_retention(now_ms=1150) == 10  # segment 0 expired, 10 is not
        assert tablet.start_offset == 10
        assert not (tmp_path / f"{segment_name(0)}.log").exists()
        assert not (tmp_path / f"{segment_name(0)}.index").exists()
        assert [b.base_offset for b in tablet.read(0)] == [10, 20, 30]  # clamped
        assert tablet.enforce_retention(now_ms=5500) == 20  # segment 20 (ts 5000) is young
        assert tablet.enforce_retention(now_ms=10**9) == 30  # the active segment always stays
        assert sorted(p.name for p in tmp_path.glob("*.log")) == [f"{segment_name(30)}.log"]
        assert tablet.append(_batch(40, 1)) == 40
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert (tablet.start_offset, tablet.end_offset) == (30, 41)


def test_read_is_a_snapshot_of_the_end_offset(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        tablet.append(_batch(0, 3))
        reader = tablet.read()
        tablet.append(_batch(3, 3))
        assert [b.next_offset for b in reader] == [3]
        assert [b.next_offset for b in tablet.read()] == [3, 6]


def test_offset_for_timestamp(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=2000) as tablet:
        assert tablet.offset_for_timestamp(0) == 0
        for i, ts in enumerate([1000, 2000, 2000, 3000]):
            tablet.append(_batch(i * 10, 10), timestamp_ms=ts)
        assert tablet.offset_for_timestamp(0) == 0
        assert tablet.offset_for_timestamp(1000) == 0
        assert tablet.offset_for_timestamp(1001) == 10
        assert tablet.offset_for_timestamp(2500) == 30
        assert tablet.offset_for_timestamp(3001) == 40


def test_writer_state_survives_reopen(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=2000) as tablet:
        tablet.append(_batch(0, 1), writer_id="a", sequence=0)
        tablet.append(_batch(1, 1), writer_id="b", sequence=7)
        tablet.append(_batch(2, 1), writer_id="a", sequence=1)
        tablet.append(_batch(3, 1))
        assert tablet.writer_state() == {"a": 1, "b": 7}
        records = list(tablet.read())
        assert [(r.writer_id, r.sequence) for r in records] == [
            ("a", 0), ("b", 7), ("a", 1), (None, None)]
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.writer_state() == {"a": 1, "b": 7}


def test_schema_mismatch_raises_and_appends_nothing(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        tablet.append(_batch(0, 2))
        wrong_type = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["x"],
                                      "score": [1.0]})
        wrong_names = pa.record_batch({"id": [1], "score": [1.0], "name": ["x"]})
        missing = pa.record_batch({"id": [1], "name": ["x"]})
        for bad in (wrong_type, wrong_names, missing):
            with pytest.raises(SchemaMismatch):
                tablet.append(bad)
        strict = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                            ("score", pa.float64())])
        with LogTablet(tmp_path / "strict", strict) as strict_tablet:
            with pytest.raises(SchemaMismatch):
                strict_tablet.append(pa.record_batch({"id": [1, None], "name": ["a", "b"],
                                                      "score": [1.0, 2.0]}))
            assert strict_tablet.append(_batch(0, 2)) == 0  # only nullability differs: cast
            assert next(strict_tablet.read()).batch.schema == strict
        assert tablet.end_offset == 2
        with pytest.raises(InvalidInput):
            tablet.read(columns=["nope"])
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.end_offset == 2


def test_concurrent_appends_get_distinct_contiguous_offsets(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=8192) as tablet:
        bases: list[int] = []
        lock = threading.Lock()

        def writer(k: int) -> None:
            for _ in range(20):
                base = tablet.append(_batch(k * 1000, 7))
                with lock:
                    bases.append(base)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(bases) == list(range(0, 560, 7))
        offsets = pa.concat_arrays([b.row_offsets for b in tablet.read()])
        assert offsets.equals(pa.array(np.arange(560), pa.int64()))
        assert pc.sum(_table(tablet).column("id")).as_py() == sum(
            sum(range(k * 1000, k * 1000 + 7)) * 20 for k in range(4))
