"""Structured Streaming reads of the changelog: concurrent writer, restart from the checkpoint,
admission control and startup modes."""

from __future__ import annotations

import json
import threading
import time

import pytest

from flightstore.client import connect
from tests.waiting import distinct_millisecond, wait_until

pytestmark = pytest.mark.slow


def _stream(spark, server, table, **options):
    reader = spark.readStream.format("flightstore").option("uri", server.uri).option("table", table)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _collect_into(seen: list):
    """A foreachBatch sink that is idempotent by batch id (Spark's contract: a batch interrupted
    before its commit is run again after a restart, and must then hold exactly the same rows)."""
    def collect(df, batch_id):
        rows = [r.asDict() for r in df.collect()]
        for i, (done, before) in enumerate(seen):
            if done == batch_id:
                assert before == rows, f"replayed micro-batch {batch_id} differs"
                return
        seen.append((batch_id, rows))
    return collect


def test_changelog_stream_with_concurrent_writer_and_restart(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE ev (k BIGINT, seq BIGINT) WITH ('bucket.num' = '3', 'bucket.key' = 'k')")
    events = conn.table("ev")
    total = {"rows": 0}

    def write(rounds: int, start: int) -> None:
        for seq in range(start, start + rounds):
            events.append({"k": list(range(8)), "seq": [seq] * 8})
            total["rows"] += 8
            time.sleep(0.05)

    seen: list = []
    checkpoint = str(tmp_path / "ck")
    writer = threading.Thread(target=write, args=(15, 0))
    writer.start()
    query = (_stream(spark, server, "ev", **{"startup.mode": "earliest", "maxRowsPerTrigger": "20"})
             .writeStream.foreachBatch(_collect_into(seen)).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    writer.join()
    wait_until(lambda: sum(len(rows) for _, rows in seen) >= 40, "the stream delivering 40 rows")
    query.stop()
    assert query.exception() is None
    write(5, 15)
    query = (_stream(spark, server, "ev", **{"startup.mode": "earliest", "maxRowsPerTrigger": "50"})
             .writeStream.foreachBatch(_collect_into(seen)).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None

    ids = [batch for batch, _ in seen]
    assert ids == sorted(set(ids)), "micro-batches repeat or go backwards across the restart"
    rows = [row for _, batch in seen for row in batch]
    assert len(rows) == total["rows"] == 20 * 8
    assert sorted((r["k"], r["seq"]) for r in rows) == sorted((k, s) for k in range(8) for s in range(20))
    assert max(len(batch) for _, batch in seen) <= 50
    assert all(r["_change_type"] == "+A" for r in rows)
    for k in range(8):  # in order per bucket (a key lives in one bucket)
        mine = [r for r in rows if r["k"] == k]
        assert [r["seq"] for r in mine] == list(range(20))
        offsets = [r["_log_offset"] for r in mine]
        assert offsets == sorted(offsets)


def test_startup_modes(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    kv = conn.table("kv")
    kv.upsert({"k": [1, 2, 3, 4], "v": ["a", "b", "c", "d"]})
    kv.upsert({"k": [2], "v": ["b2"]})
    kv.delete({"k": [4]})
    middle = kv.offsets("end")
    stamp = distinct_millisecond()
    kv.upsert({"k": [5, 1], "v": ["e", "a2"]})

    def run(name: str, **options) -> list[dict]:
        seen: list = []
        query = (_stream(spark, server, "kv", **options).writeStream.foreachBatch(_collect_into(seen))
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None
        return [row for _, batch in seen for row in batch]

    tail = [("+I", 5, "e"), ("-U", 1, "a"), ("+U", 1, "a2")]
    full = run("full", **{"startup.mode": "full", "columns": "k,v"})
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in full) == sorted(
        [("+I", 1, "a2"), ("+I", 2, "b2"), ("+I", 3, "c"), ("+I", 5, "e")])
    # Snapshot rows are rows of a KV snapshot, not changes: they carry no offset or commit time.
    assert all(r["_log_offset"] is None and r["_commit_timestamp"] is None for r in full)
    assert set(full[0]) == {"k", "v", "_change_type", "_log_offset", "_commit_timestamp"}
    # after the snapshot, the changelog continues from the snapshot's offsets
    kv.upsert({"k": [3], "v": ["c2"]})
    full_query_rows = run("full", **{"startup.mode": "full", "columns": "k,v"})
    assert [(r["_change_type"], r["k"], r["v"]) for r in full_query_rows] == [("-U", 3, "c"), ("+U", 3, "c2")]

    given = json.dumps({str(bucket): offset for bucket, offset in middle.items()})
    from_offsets = run("offsets", **{"startup.mode": "offsets", "startup.offsets": given})
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in from_offsets) == sorted(
        tail + [("-U", 3, "c"), ("+U", 3, "c2")])
    by_time = run("timestamp", **{"startup.mode": "timestamp", "startup.timestamp": str(stamp)})
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in by_time) == sorted(
        tail + [("-U", 3, "c"), ("+U", 3, "c2")])
    assert run("latest", **{"startup.mode": "latest"}) == []
    earliest = run("earliest", **{"startup.mode": "earliest"})
    assert len(earliest) == sum(kv.offsets("end").values())
