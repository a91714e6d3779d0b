"""A write spanning several buckets is all or nothing, even when a crash cuts it between buckets."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.intents import IntentLog
from flightstore.store import TABLE_WRITER, Store

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def rows(keys, value):
    return pa.table({"k": pa.array(keys, pa.int64()), "v": [value] * len(keys)}, schema=SCHEMA)


def crash_after_first_bucket(table, data, kinds, writer_id, sequence):
    """Leave the disk exactly as a crash between two buckets of one write would."""
    record = data if kinds is None else data.append_column(changetype.CHANGE_TYPE_COLUMN,
                                                           pa.array(kinds, pa.int8()))
    IntentLog(table.directory / "intent").begin(
        {"target": None, "overwrite": False, "kv": kinds is not None, "writer_id": writer_id,
         "sequence": sequence}, record)
    buckets = table.buckets_of(data)
    first = int(np.unique(buckets)[0])
    mask = buckets == first
    if kinds is None:
        table.logs[first].append(data.filter(pa.array(mask)), writer_id=writer_id, sequence=sequence)
    else:
        table.kvs[first].apply(data.filter(pa.array(mask)), kinds[mask], None, writer_id=writer_id,
                               sequence=sequence)
    return first


def test_interrupted_multi_bucket_writes_are_completed_on_open(tmp_path):
    keys = list(range(40))
    with Store(tmp_path) as store:
        kv = store.create_table("kv", SCHEMA, primary_key=["k"], options={"bucket.num": 4})
        log = store.create_table("log", SCHEMA, options={"bucket.num": 4, "bucket.key": "k"})
        kv.upsert(rows(keys, "old"))
        assert kv.writer_sequence(TABLE_WRITER) == 0  # multi-bucket writes get the table's writer
        kinds = np.full(len(keys), changetype.UPDATE_AFTER, np.int8)
        crash_after_first_bucket(kv, rows(keys, "new"), kinds, TABLE_WRITER, 1)
        crash_after_first_bucket(log, rows(keys, "x"), None, "w", 0)
        half = kv.scan_table().column("v").to_pylist()
        assert 0 < half.count("new") < len(keys)  # the crash left it half applied
        assert 0 < log.row_count() < len(keys)
    with Store(tmp_path) as store:
        kv, log = store.table("kv"), store.table("log")
        assert kv.scan_table().column("v").to_pylist() == ["new"] * len(keys)
        assert kv.row_count() == len(keys)
        assert sorted(log.scan_table().column("k").to_pylist()) == keys
        assert not (kv.directory / "intent").read_bytes()  # cleared once complete
        # The writer's retry of the same batch is still a duplicate, and it moves on normally.
        assert log.append(rows(keys, "x"), writer_id="w", sequence=0).duplicate
        log.append(rows(keys, "y"), writer_id="w", sequence=1)
        assert log.row_count() == 2 * len(keys)


def test_torn_intent_is_discarded(tmp_path):
    with Store(tmp_path) as store:
        table = store.create_table("kv", SCHEMA, primary_key=["k"], options={"bucket.num": 4})
        table.upsert(rows(range(10), "a"))
        path = table.directory / "intent"
        IntentLog(path).begin({"target": None, "overwrite": False, "kv": True, "writer_id": "w",
                               "sequence": 0}, rows(range(10), "b"))
        path.write_bytes(path.read_bytes()[:-7])  # torn: the write never reached any bucket
    with Store(tmp_path) as store:
        assert store.table("kv").scan_table().column("v").to_pylist() == ["a"] * 10
