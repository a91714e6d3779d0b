"""Writer ids expire after 'table.writer-id.expiration' and are dropped everywhere they are kept.

Time is an injected clock (milliseconds), moved by the tests: no sleeps.
"""

from __future__ import annotations

import struct
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import flightstore
from flightstore.errors import OutOfOrderSequence, WriterExpired
from flightstore.kv.undo import undo_fence
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from flightstore.writers import WriterRegistry

HOUR = 3_600_000
SCHEMA = pa.schema([("k", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
OPTIONS = {"bucket.num": "2", "table.writer-id.expiration": "1h"}


class Clock:
    """Starts at the wall clock (writes made outside the table, like a crash's, carry it)."""

    def __init__(self, now: int | None = None) -> None:
        self.now = int(time.time() * 1000) if now is None else now

    def __call__(self) -> int:
        return self.now


def _rows(*keys: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "a": pa.array(keys, pa.int64()),
                     "b": pa.array(keys, pa.int64())})


def _kept_anywhere(table, writer: str) -> list[str]:
    """Where ``writer`` still has state: the table, each bucket's log and KV meta, ownership."""
    places = []
    if table.writer_sequence(writer) is not None:
        places.append("table")
    for bucket, log in enumerate(table.logs):
        if writer in log.writer_state():
            places.append(f"log {bucket}")
    for bucket, kv in enumerate(table.kvs):
        if writer in kv.writer_state():
            places.append(f"kv {bucket}")
        if undo_fence(kv, writer) != (0, None):
            places.append(f"undo fence {bucket}")
    if writer in table.ownership.claims():
        places.append("ownership")
    return places


def test_an_expired_writer_is_dropped_everywhere_and_its_next_batch_refused(tmp_path):
    clock = Clock()
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
        table.upsert(_rows(1, 2, 3), writer_id="w", sequence=0)
        table.upsert(_rows(1, 2).select(["k", "a"]), ["k", "a"], writer_id="w", sequence=1)  # claims a
        table.undo("w", 0)  # leaves an undo fence in every bucket
        table.upsert(_rows(4).select(["k", "a"]), ["k", "a"], writer_id="w", sequence=1)
        assert set(_kept_anywhere(table, "w")) >= {"table", "log 0", "kv 0", "undo fence 0",
                                                    "ownership"}
        clock.now += HOUR  # exactly the expiration: still alive
        assert table.expire_writers() == []
        clock.now += 1
        table.upsert(_rows(9), writer_id="alive", sequence=0)
        assert table.expire_writers() == ["w"]
        assert _kept_anywhere(table, "w") == []
        assert table.writer_sequence("alive") == 0
        offsets = table.end_offsets()
        with pytest.raises(WriterExpired, match=r"writer 'w' of default.t expired: it wrote nothing "
                           r"for 'table.writer-id.expiration' = 1h"):
            table.upsert(_rows(5), writer_id="w", sequence=2)
        assert table.end_offsets() == offsets  # nothing written
        table.upsert(_rows(5), writer_id="w", sequence=0)  # starting afresh is accepted
        assert table.writer_sequence("w") == 0
        table.upsert(_rows(6), writer_id="gone", sequence=0)
        clock.now += 2 * HOUR
        store.enforce_retention()  # the server's periodic housekeeping expires writers too
        assert table.writer_sequence("gone") is None and table.writer_sequence("w") is None
    with Store(tmp_path / "data", clock=clock) as store:  # a restart does not bring them back
        table = store.table("t")
        assert _kept_anywhere(table, "gone") == [] and _kept_anywhere(table, "w") == []
        with pytest.raises(OutOfOrderSequence, match="expired after 'table.writer-id.expiration'"):
            table.upsert(_rows(7), writer_id="gone", sequence=1)


def test_a_writer_past_its_expiration_is_refused_without_waiting_for_housekeeping(tmp_path):
    clock = Clock()
    with Store(tmp_path / "data", clock=clock) as store:
        log = store.create_table("events", SCHEMA, options=OPTIONS)
        log.append(_rows(1), writer_id="job", sequence=0)
        clock.now += HOUR + 1
        with pytest.raises(WriterExpired, match="'job'"):
            log.append(_rows(2), writer_id="job", sequence=1)
        assert _kept_anywhere(log, "job") == []
        assert log.row_count() == 1


def test_micro_batch_writers_do_not_pile_up(tmp_path):
    clock = Clock()
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
        for batch in range(300):  # one writer id per micro-batch, as a Spark stream writes
            table.upsert(_rows(batch, batch + 1000), writer_id=f"batch-{batch}", sequence=0)
            clock.now += 1000
        assert sum(len(kv.writer_state()) for kv in table.kvs) >= 300
        clock.now += HOUR
        assert len(table.expire_writers()) == 300
        assert all(kv.writer_state() == {} for kv in table.kvs)
        assert all(log.writer_state() == {} for log in table.logs)
        assert table.row_count() == 600  # the data stays


def test_state_without_a_write_time_counts_from_the_open(tmp_path):
    clock = Clock()
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
        table.kvs[0].write_meta({b"writer:legacy": struct.pack(">q", 5)})  # the pre-expiry format
    clock.now += 100 * HOUR
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.table("t")
        assert table.writer_sequence("legacy") == 5
        clock.now += HOUR + 1
        assert table.expire_writers() == ["legacy"]


def test_registry_rules():
    clock = Clock(0)
    registry = WriterRegistry("db.t", 10, clock)
    registry.check("a", 0)
    registry.note("a", 0, 0)
    with pytest.raises(OutOfOrderSequence, match="next expected batch is 1;"):
        registry.check("a", 2)
    registry.check("a", 1)
    registry.reset("a", -1)
    assert "a" not in registry
    registry.note("b", 3, 5)
    assert registry.expired(15) == [] and registry.expired(16) == ["b"]
    registry.forget(["b"], 16)
    with pytest.raises(WriterExpired, match="10ms"):
        registry.check("b", 4)
    registry.check("b", 0)  # a fresh start


def test_the_expiry_refusal_reaches_a_client(tmp_path):
    clock = Clock()
    store = Store(tmp_path / "data", clock=clock)
    server = FlightSqlServer(store, "grpc://127.0.0.1:0")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        with flightstore.connect(server.uri, timeout=30) as conn:
            conn.sql("CREATE TABLE t (k BIGINT, a BIGINT, b BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                     "WITH ('table.writer-id.expiration' = '1h')")
            writer = conn.table("t", writer_id="job-7")
            writer.upsert(_rows(1))
            clock.now += HOUR + 1
            with pytest.raises(pa.ArrowInvalid, match="writer 'job-7' of default.t expired"):
                writer.upsert(_rows(2))
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_a_write_cut_between_buckets_completes_on_open_even_after_its_writer_expired(tmp_path):
    """The roll-forward runs with the writer's state (its buckets skip what they applied) before
    expiry drops it: a sum shows a bucket applied twice."""
    from flightstore import changetype
    from tests.test_intents import crash_after_first_bucket

    clock = Clock()
    keys = list(range(40))
    options = {**OPTIONS, "bucket.num": "4", "table.merge-engine": "aggregation", "fields.a.agg": "sum"}
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.create_table("t", SCHEMA, primary_key=["k"], options=options)
        table.upsert(_rows(*keys), writer_id="job", sequence=0)
        more = _rows(*keys).set_column(1, "a", pa.array([1000] * len(keys), pa.int64()))
        kinds = np.full(len(keys), changetype.UPDATE_AFTER, np.int8)
        crash_after_first_bucket(table, more, kinds, "job", 1)
    clock.now += 10 * HOUR  # the server stayed down past the writer's expiration
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.table("t")
        rows = sorted(table.scan_table().to_pylist(), key=lambda r: r["k"])
        assert [r["a"] for r in rows] == [k + 1000 for k in keys]  # completed, each bucket once


def test_an_expired_writer_of_a_partitioned_table_is_dropped_in_every_partition(tmp_path):
    clock = Clock()
    schema = pa.schema([("k", pa.int64()), ("dt", pa.string()), ("a", pa.int64())])
    with Store(tmp_path / "data", clock=clock) as store:
        table = store.create_table("p", schema, primary_key=["k", "dt"], partition_keys=["dt"], options=OPTIONS)
        rows = pa.table({"k": pa.array([1, 2], pa.int64()), "dt": ["2026-01-01", "2026-01-02"],
                         "a": pa.array([1, 2], pa.int64())})
        table.upsert(rows, writer_id="w", sequence=0)  # one row in each partition
        units = list(table.units.values())
        assert len(units) == 2 and all(unit.writer_sequence("w") == 0 for unit in units)
        clock.now += HOUR + 1
        assert table.expire_writers() == ["w"]
        assert table.writer_sequence("w") is None
        assert all(_kept_anywhere(unit, "w") == [] for unit in units)
