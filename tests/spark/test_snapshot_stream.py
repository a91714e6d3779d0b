"""Spark over a primary-key table whose early changelog has expired: ``startup.mode=full`` reads the
rows at one offset (a KV snapshot image plus the changelog tail after it), which equal the table,
then streams every change from exactly that offset;
``earliest`` starts at the earliest offset held and an expired ``startup.offsets`` fails clearly."""

from __future__ import annotations

import json

import pytest

from flightstore.client import connect

pytestmark = pytest.mark.slow

CREATE = ("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2', "
          "'table.log.ttl' = '1ms', 'table.log.segment.bytes' = '1024')")


def _stream(spark, server, tmp_path, name: str, **options) -> list[dict]:
    reader = spark.readStream.format("flightstore").option("uri", server.uri).option("table", "kv")
    for key, value in options.items():
        reader = reader.option(key, value)
    seen: list = []

    def collect(df, batch_id):
        if all(done != batch_id for done, _ in seen):
            seen.append((batch_id, [r.asDict() for r in df.collect()]))

    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return [row for _, rows in seen for row in rows]


def _write(kv, state: dict, rounds: int, start: int) -> None:
    for i in range(start, start + rounds):
        keys = list(range(i % 4, 80, 4))
        kv.upsert({"k": keys, "v": [f"v{i}"] * len(keys)})
        state.update({k: f"v{i}" for k in keys})
        gone = [(i * 7) % 80]
        kv.delete({"k": gone})
        for k in gone:
            state.pop(k, None)


def test_full_mode_on_an_expired_changelog(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql(CREATE)
    kv = conn.table("kv")
    state: dict = {}
    _write(kv, state, 40, 0)
    kv.snapshot()
    _write(kv, state, 40, 40)
    kv.snapshot()  # and retention: the changelog before the first snapshot is gone
    _write(kv, state, 5, 80)  # a tail after the newest snapshot
    starts = kv.offsets("start")
    assert all(offset > 0 for offset in starts.values())

    # The rows at the end offsets: the newest snapshot's image merged with the tail after it.
    snapshot_offsets = kv.offsets("end")
    full = _stream(spark, server, tmp_path, "full", **{"startup.mode": "full"})
    assert all(r["_change_type"] == "+I" and r["_log_offset"] is None for r in full)
    assert {r["k"]: r["v"] for r in full} == state and len(full) == len(state)

    # New changes stream from exactly the snapshot read's offsets: no gap, no duplicate.
    kv.upsert({"k": [1, 500], "v": ["changed", "new"]})
    kv.delete({"k": [2]})
    expected_changes = [("-U", 1, state[1]), ("+U", 1, "changed"), ("+I", 500, "new")]
    if 2 in state:
        expected_changes.append(("-D", 2, state[2]))
    changes = _stream(spark, server, tmp_path, "full", **{"startup.mode": "full"})
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in changes) == sorted(expected_changes)
    assert min(r["_log_offset"] for r in changes) >= min(snapshot_offsets.values())

    # earliest starts at the earliest offset each bucket still holds.
    earliest = _stream(spark, server, tmp_path, "earliest", **{"startup.mode": "earliest"})
    held = {b: kv.offsets("end")[b] - kv.offsets("start")[b] for b in starts}
    assert len(earliest) == sum(held.values())
    assert min(r["_log_offset"] for r in earliest) >= min(kv.offsets("start").values())

    # A batch read of the table is the same consistent view.
    batch = spark.read.format("flightstore").option("uri", server.uri).option("table", "kv").load()
    state.update({1: "changed", 500: "new"})
    state.pop(2, None)
    assert {r["k"]: r["v"] for r in batch.collect()} == state

    # An offset the log no longer holds is an error naming the earliest one.
    expired = json.dumps({"0": 0})
    with pytest.raises(Exception, match=f"earliest offset still held is {kv.offsets('start')[0]}"):
        _stream(spark, server, tmp_path, "expired", **{"startup.mode": "offsets", "startup.offsets": expired})
    conn.close()
