"""A log's records copied verbatim to another log (what a follower does), truncation, the high
watermark and the leader epoch cache."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightstore.errors import InvalidInput, OffsetOutOfRange, SchemaVersionUnknown
from flightstore.log import LogTablet
from flightstore.replica.epochs import LeaderEpochCache, divergence

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()),
                            pa.array([f"v{i}" for i in range(start, start + n)])], schema=SCHEMA)


def _rows(log: LogTablet, **kwargs) -> list[dict]:
    return [row for b in log.read(0, **kwargs) for row in b.batch.to_pylist()]


def _copy(source: LogTablet, target: LogTablet) -> None:
    while target.end_offset < source.end_offset:
        for record in source.read_raw(target.end_offset, 1 << 20):
            target.append_raw(record)


def test_records_copy_verbatim_with_writers_and_offsets(tmp_path):
    leader = LogTablet(tmp_path / "a", SCHEMA, segment_bytes=2_000, fsync=False)
    follower = LogTablet(tmp_path / "b", SCHEMA, segment_bytes=2_000, fsync=False)
    for i in range(30):
        leader.append(_batch(i * 5, 5), writer_id=f"w{i % 3}", sequence=i // 3, timestamp_ms=1000 + i)
    _copy(leader, follower)
    assert follower.end_offset == leader.end_offset == 150
    assert _rows(follower) == _rows(leader)
    assert follower.writer_state() == leader.writer_state()
    assert [(b.base_offset, b.timestamp_ms, b.writer_id, b.sequence) for b in follower.read(0)] == \
           [(b.base_offset, b.timestamp_ms, b.writer_id, b.sequence) for b in leader.read(0)]
    follower.close()
    reopened = LogTablet(tmp_path / "b", SCHEMA, segment_bytes=2_000, fsync=False)
    assert _rows(reopened) == _rows(leader)


def test_each_record_copied_as_it_is_appended_reads_back_whole(tmp_path):
    """A leader reads every record just after appending it (the active segment grew past the
    memory map of its earlier reads), then older ones again (from the map): the bytes are the
    record's in both cases (the follower checks each payload's CRC)."""
    leader = LogTablet(tmp_path / "a", SCHEMA, fsync=False)
    follower = LogTablet(tmp_path / "b", SCHEMA, fsync=False)
    again = LogTablet(tmp_path / "c", SCHEMA, fsync=False)
    for i in range(12):
        leader.append(_batch(i * 7, 7), writer_id="w", sequence=i)
        if i == 3:
            list(leader.read(0))  # maps the segment as it is now
        _copy(leader, follower)
    _copy(leader, again)  # every record once more: the older ones from the map
    assert _rows(follower) == _rows(again) == _rows(leader)
    assert [r["k"] for r in _rows(follower)] == list(range(84))


def test_a_copied_record_must_continue_the_log_and_keep_its_checksum(tmp_path):
    leader = LogTablet(tmp_path / "a", SCHEMA, fsync=False)
    follower = LogTablet(tmp_path / "b", SCHEMA, fsync=False)
    leader.append(_batch(0, 3))
    leader.append(_batch(3, 3))
    first, second = leader.read_raw(0, 1 << 20)
    with pytest.raises(InvalidInput):
        follower.append_raw(second)
    bad = first.__class__(**{**first.__dict__, "payload": bytes(first.payload)[:-1] + b"\x00"})
    with pytest.raises(Exception, match="checksum"):
        follower.append_raw(bad)
    assert follower.end_offset == 0
    with pytest.raises(OffsetOutOfRange):
        leader.read_raw(7, 100)


def test_truncation_cuts_records_and_the_log_continues(tmp_path):
    log = LogTablet(tmp_path / "a", SCHEMA, segment_bytes=1_500, fsync=False)
    for i in range(20):
        log.append(_batch(i * 4, 4), writer_id="w", sequence=i)
    assert log.truncate_to(40) == 40
    assert [r["k"] for r in _rows(log)] == list(range(40))
    assert log.writer_state() == {"w": 9}
    log.append(_batch(100, 2))
    assert [r["k"] for r in _rows(log)][-2:] == [100, 101]
    log.close()
    reopened = LogTablet(tmp_path / "a", SCHEMA, segment_bytes=1_500, fsync=False)
    assert reopened.end_offset == 42
    assert [r["k"] for r in _rows(reopened)] == list(range(40)) + [100, 101]
    with pytest.raises(InvalidInput):
        reopened.truncate_to(41)  # inside a record


def test_truncation_below_the_start_empties_the_log_at_that_offset(tmp_path):
    log = LogTablet(tmp_path / "a", SCHEMA, fsync=False)
    log.append(_batch(0, 4))
    assert log.truncate_to(0) == 0
    assert _rows(log) == []
    log.append(_batch(7, 1))
    assert _rows(log) == [{"k": 7, "v": "v7"}]


def test_reads_stop_at_the_high_watermark(tmp_path):
    log = LogTablet(tmp_path / "a", SCHEMA, fsync=False)
    log.append(_batch(0, 4))
    log.set_high_watermark(0)
    log.append(_batch(4, 4))
    assert _rows(log) == []
    assert not log.wait_for(0, timeout=0.01)
    log.set_high_watermark(4)
    assert [r["k"] for r in _rows(log)] == [0, 1, 2, 3]
    assert [r["k"] for r in _rows(log, uncommitted=True)] == list(range(8))
    assert log.offset_for_timestamp(0) == 0
    log.set_high_watermark(None)
    assert len(_rows(log)) == 8


def test_schema_versions_follow_the_replicated_records(tmp_path):
    v2 = SCHEMA.append(pa.field("extra", pa.int32()))
    leader = LogTablet(tmp_path / "a", SCHEMA, fsync=False)
    leader.append(_batch(0, 2))
    leader.evolve(v2, 2)
    leader.append(pa.record_batch([pa.array([9], pa.int64()), pa.array(["x"]), pa.array([1], pa.int32())],
                                  schema=v2))
    follower = LogTablet(tmp_path / "b", SCHEMA, fsync=False)
    follower.following = True
    records = leader.read_raw(0, 1 << 20)
    follower.append_raw(records[0])
    with pytest.raises(SchemaVersionUnknown):
        follower.append_raw(records[1])
    follower.evolve(v2, 2)  # the catalog caught up: no epoch of its own, the records place it
    follower.append_raw(records[1])
    assert _rows(follower) == _rows(leader)


def test_epoch_cache_finds_where_logs_diverge(tmp_path):
    leader = LeaderEpochCache(tmp_path / "l", fsync=False) if (tmp_path / "l").mkdir() is None else None
    follower = LeaderEpochCache(tmp_path / "f", fsync=False) if (tmp_path / "f").mkdir() is None else None
    leader.assign(0, 0)
    follower.assign(0, 0)
    follower.assign(1, 100)  # a leader of epoch 1 appended 100..149 that nobody else got
    leader.assign(2, 120)
    epoch, end = leader.end_for(follower.latest, 200)
    assert (epoch, end) == (0, 120)
    assert divergence(follower, 150, epoch, end) == 100
    # the same epochs: cut at the shorter end
    other = LeaderEpochCache(tmp_path / "o", fsync=False) if (tmp_path / "o").mkdir() is None else None
    other.assign(0, 0)
    assert divergence(other, 150, *leader.end_for(0, 200)) == 120
    assert divergence(other, 90, *leader.end_for(0, 200)) == 90
    follower.truncate_from(100)
    assert follower.entries == [(0, 0)]
    assert LeaderEpochCache(tmp_path / "f").entries == [(0, 0)]
