"""A write is all or nothing also when its failure depends on stored values (an aggregate that
overflows in the third bucket, a merge engine's refusal), on storage (a log segment that cannot
grow: a real EFBIG from the kernel) or on a client that goes away mid-upload; and replaying a
recorded intent never makes a table unreadable (issue 20 item 2). The property test over every
merge engine is tests/test_all_or_nothing_property.py."""

from __future__ import annotations

import decimal
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyroaring
import pytest

from flightstore import changetype, maintenance
from flightstore.errors import InvalidInput
from flightstore.intents import IntentLog
from flightstore.store import TABLE_WRITER, Store
from tests.kv.fold import fold_changelog, kv_contents
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
DEC = pa.decimal128(5, 2)
AGG = {"bucket.num": 4, "table.merge-engine": "aggregation", "fields.s.agg": "sum"}


def decimals(values) -> pa.Array:
    return pa.array([decimal.Decimal(v) for v in values], DEC)


def snapshot(table) -> tuple:
    """What a refused write must leave untouched: rows, log ends, row count, writer sequences."""
    return (sorted(table.scan_table().to_pylist(), key=str), table.end_offsets(), table.row_count(),
            table.writer_sequence(TABLE_WRITER), table.writer_sequence("w"))


def test_a_sum_overflow_in_one_bucket_refuses_the_whole_write_and_the_table_reopens(tmp_path):
    """The issue's case: DECIMAL(5,2) sums, 4 buckets, 20 rows of which one key overflows."""
    schema = pa.schema([("id", pa.int64()), ("s", DEC)])
    with Store(tmp_path, fsync=False) as store:
        table = store.create_table("agg", schema, primary_key=["id"], options=AGG)
        table.upsert(pa.table({"id": pa.array(range(20), pa.int64()), "s": decimals(["900.00"] * 20)}))
        before = snapshot(table)
        buckets = table.buckets_of(pa.table({"id": pa.array(range(20), pa.int64())}))
        last = int(np.flatnonzero(buckets == buckets.max())[0])  # a key of the last bucket written
        values = ["1.00"] * 20
        values[last] = "100.00"  # 900 + 100 does not fit DECIMAL(5,2)
        with pytest.raises(InvalidInput, match="sum overflows decimal128"):
            table.upsert(pa.table({"id": pa.array(range(20), pa.int64()), "s": decimals(values)}),
                         writer_id="w", sequence=0)
        assert snapshot(table) == before  # not one bucket changed
        assert not (table.directory / "intent").read_bytes()  # nothing to replay
        table.upsert(pa.table({"id": pa.array([last], pa.int64()), "s": decimals(["99.99"])}))
    with Store(tmp_path, fsync=False) as store:  # reopens and reads
        table = store.table("agg")
        assert len(table.scan_table()) == 20
        assert table.lookup({"id": [last]}).column("s").to_pylist() == [decimal.Decimal("999.99")]
        assert kv_contents(table, ["id"]) == fold_changelog(table, ["id"])


def test_a_merge_engine_refusal_in_one_partition_refuses_the_whole_write(tmp_path):
    """rbm32 refuses bytes that are not a bitmap, in the one bucket that holds them: every bucket
    of every partition is prepared before any commits."""
    schema = pa.schema([("dt", pa.string()), ("id", pa.int64()), ("ids", pa.binary())])
    with Store(tmp_path, fsync=False) as store:
        table = store.create_table("bm", schema, primary_key=["dt", "id"], partition_keys=["dt"],
                                   options={"bucket.num": 3, "table.merge-engine": "aggregation",
                                            "fields.ids.agg": "rbm32"})
        bitmap = pyroaring.BitMap([1, 2]).serialize()
        keys = list(range(12))
        table.upsert({"dt": ["a"] * 6 + ["b"] * 6, "id": keys, "ids": [bitmap] * 12})
        before = snapshot(table)
        for broken in (0, 11):  # in the first partition written, or in the last
            ids = [pyroaring.BitMap([3]).serialize()] * 12
            ids[broken] = b"not a bitmap"
            with pytest.raises(InvalidInput, match="not a serialized rbm32 bitmap"):
                table.upsert({"dt": ["a"] * 6 + ["b"] * 6, "id": keys, "ids": ids})
            assert snapshot(table) == before


def _run_full_disk_child(data_dir: Path, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.full_disk_writer", str(data_dir), mode], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {step["step"]: step for step in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("mode", ["retry", "crash", "reopen", "alter"])
def test_a_full_log_segment_mid_write_is_rolled_forward_never_left_half(tmp_path, mode):
    """The last bucket's log append fails with EFBIG after the others committed: the write stays
    recorded, writes are refused until it completes (by the retry, or at the next open), reads go
    on, and in the end every batch is applied exactly once."""
    steps = _run_full_disk_child(tmp_path / "data", mode)
    for table in ("agg", "ev"):
        assert steps["failed"][table].startswith("incomplete: ") and "File too large" in steps["failed"][table]
        assert "will be completed, not undone" in steps["failed"][table]
        assert steps["refused"][table].startswith("incomplete: nothing was done")
    assert 1 in steps["failed"]["sums"] and 11 in steps["failed"]["sums"]  # reads went on meanwhile
    if mode == "reopen":  # opened while the segment is still full: serves, refuses writes
        assert steps["reopened"]["sums"] == steps["failed"]["sums"]
        assert steps["reopened"]["agg"].startswith("incomplete: nothing was done")
    if mode != "crash":
        assert steps["retried"]["agg"] == steps["retried"]["ev"] == "duplicate"  # batch 1, once
        assert steps["next"]["sums"] == [111] * 16 and steps["next"]["events"] == 4 + 3 * 16
    with Store(tmp_path / "data", fsync=False) as store:
        agg, ev = store.table("agg"), store.table("ev")
        expected = 111 if mode != "crash" else 11  # crash: completed at this open
        assert [r["n"] for r in agg.scan_table(["id", "n"]).to_pylist() if r["id"] < 16] == [expected] * 16
        assert ev.row_count() == 4 + (3 if mode != "crash" else 2) * 16
        assert agg.writer_sequence("w") == ev.writer_sequence("w") == (2 if mode != "crash" else 1)
        assert kv_contents(agg, ["id"]) == fold_changelog(agg, ["id"])
        assert not (agg.directory / "intent").read_bytes() and not (ev.directory / "intent").read_bytes()


def test_an_older_intent_whose_replay_overflows_is_set_aside_and_the_table_serves(tmp_path, caplog):
    """An intent of an older version records input rows; replaying one that cannot apply (here,
    as main did, one bucket applied it and the next overflows) must not keep the table shut."""
    schema = pa.schema([("id", pa.int64()), ("s", DEC)])
    keys = pa.array(range(8), pa.int64())
    with Store(tmp_path, fsync=False) as store:
        table = store.create_table("agg", schema, primary_key=["id"], options=AGG)
        table.upsert(pa.table({"id": keys, "s": decimals(["900.00"] * 8)}))
        data = pa.table({"id": keys, "s": decimals(["1.00"] * 7 + ["100.00"])})
        kinds = np.full(8, changetype.UPDATE_AFTER, np.int8)
        buckets = table.buckets_of(data)
        IntentLog(table.directory / "intent").begin(
            {"target": None, "overwrite": False, "kv": True, "writer_id": "w", "sequence": 0},
            data.append_column(changetype.CHANGE_TYPE_COLUMN, pa.array(kinds)))
        first = buckets == buckets[0]  # what main applied before it met the overflow
        table.kvs[int(buckets[0])].apply(data.filter(pa.array(first)), kinds[first], writer_id="w", sequence=0)
        applied = sorted(table.scan_table().to_pylist(), key=str)
    caplog.set_level(logging.ERROR, "flightstore.intents")
    with Store(tmp_path, fsync=False) as store:
        table = store.table("agg")
        assert sorted(table.scan_table().to_pylist(), key=str) == applied  # opens and serves
        [aside] = IntentLog(table.directory / "intent").set_aside_files()
        assert str(aside) in caplog.text and "writer 'w' batch 0" in caplog.text
        assert "sum overflows" in caplog.text
        table.upsert(pa.table({"id": keys, "s": decimals(["1.00"] * 8)}), writer_id="w", sequence=1)
        assert table.writer_sequence("w") == 1
    report = maintenance.verify(tmp_path)
    assert any(str(aside) in str(finding) for finding in report.findings)


def test_an_upload_cut_by_a_killed_client_applies_whole_chunks_only(tmp_path):
    """DoPut chunks (``write.chunk-rows``) are single writes: the client dies mid-upload, the
    chunks applied before stay whole (every bucket), the unfinished one is dropped whole."""
    from tests.server.conftest import RunningServer
    server = RunningServer(tmp_path / "data", options={"write.chunk-rows": "100"})
    try:
        server.store.create_table("kv", pa.schema([("k", pa.int64()), ("v", pa.int64())]),
                                  primary_key=["k"], options={"bucket.num": 4})
        child = subprocess.Popen([sys.executable, "-c", _HALF_UPLOAD, server.uri], cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "sent"
            table = server.store.table("kv")
            wait_until(lambda: table.writer_sequence("up") == 1, "two chunks applied", timeout=60)
        finally:
            child.kill()
            child.wait(timeout=30)
        wait_until(lambda: 'method="DoPut"' in server.server.metrics.exposition(), "the upload ended")
        assert sorted(r["k"] for r in table.scan_table().to_pylist()) == list(range(200))
        assert table.writer_sequence("up") == 1
    finally:
        server.stop()


# A client that streams 5 messages of 50 rows (chunks of 100 rows on the server) under writer "up"
# and then never finishes the upload; the test kills it.
_HALF_UPLOAD = """
import sys, pyarrow as pa
from pyarrow import flight
from flightstore.server import tickets
client = flight.FlightClient(sys.argv[1])
payload = {"op": "upsert", "table": "kv", "columns": None, "writer_id": "up", "sequence": 0}
data = pa.table({"k": pa.array(range(250), pa.int64()), "v": pa.array(range(250), pa.int64())})
writer, _ = client.do_put(flight.FlightDescriptor.for_command(tickets.encode_custom(payload)), data.schema)
for batch in data.to_batches(max_chunksize=50):
    writer.write_batch(batch)
print("sent", flush=True)
sys.stdin.read()
"""
