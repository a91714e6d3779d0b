"""The replication answer frame: every stored record field travels verbatim (writer ids and
sequences or their absence, statistics, column checksums, lost ranges, payload bytes), records of
several replicas stay apart and in order, and a frame cut short is refused, never half read."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightstore.errors import CorruptData
from flightstore.log import LogTablet
from flightstore.log.record import RawRecord
from flightstore.replica import protocol

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _records(tmp_path) -> list[RawRecord]:
    log = LogTablet(tmp_path / "log", SCHEMA, fsync=False, statistics_columns=["k"])
    log.append(pa.table({"k": [1, 2, 3], "v": ["a", None, "c"]}), writer_id="w-é", sequence=7)
    log.append(pa.table({"k": [4], "v": ["d"]}))  # no writer, no sequence
    records = log.read_raw(0, 1 << 20)
    lost = RawRecord(records[-1].next_offset, 5, 1_234, None, None, b'{"lost":"repaired"}', (), 0, b"", 2,
                     "repaired")
    log.close()
    return records + [lost]


def test_an_answer_frame_carries_every_record_field_verbatim(tmp_path):
    records = _records(tmp_path)
    a, b = ("table-a", -1, 0), ("table-b", 17, 2)
    items = [(a, 3, records[0]), (b, 4, records[1]), (a, 5, records[2])]
    meta = {"replicas": [{"key": list(a), "hw": 1, "leo": 9}]}
    frame = protocol.encode_answer(meta, protocol.encode_records(items))
    got_meta, got = protocol.decode_answer(frame)
    assert got_meta == meta
    assert list(got) == [a, b]
    assert [e for e, _ in got[a]] == [3, 5] and [e for e, _ in got[b]] == [4]
    for (_, _, sent), received in zip(items, [got[a][0][1], got[b][0][1], got[a][1][1]]):
        assert received.base_offset == sent.base_offset and received.num_rows == sent.num_rows
        assert received.timestamp_ms == sent.timestamp_ms
        assert received.writer_id == sent.writer_id and received.sequence == sent.sequence
        assert received.stats_raw == sent.stats_raw and received.checksums == sent.checksums
        assert received.payload_crc == sent.payload_crc and received.schema_version == sent.schema_version
        assert received.lost == sent.lost
        assert bytes(received.payload) == bytes(sent.payload)
    assert got[a][0][1].writer_id == "w-é" and got[a][0][1].sequence == 7
    assert got[b][0][1].writer_id is None and got[b][0][1].sequence is None
    assert got[a][1][1].lost == "repaired"


def test_a_frame_without_records_and_a_frame_cut_short(tmp_path):
    assert protocol.decode_answer(protocol.encode_answer({"epoch_end": []})) == ({"epoch_end": []}, {})
    records = protocol.encode_records([(("t", -1, 0), 1, _records(tmp_path)[0])])
    for cut in (1, protocol.ITEM.size + 3, len(records) - 1):
        with pytest.raises(CorruptData):
            protocol.decode_answer(protocol.encode_answer({}, records[:cut]))
    with pytest.raises(CorruptData):
        protocol.decode_answer(pa.py_buffer(b"\x05\x00"))
