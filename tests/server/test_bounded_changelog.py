"""A primary-key table under a steady update load, served by a real `flightstore serve` process that
takes KV snapshots on a short interval: its changelog is truncated (the earliest offset moves past
0), its disk use stays bounded, and after kill -9 of the server and a restart it equals a Python
fold of every acknowledged write."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from tests.forked_server import ForkedServer

pytestmark = pytest.mark.slow

KEYS = 1500
ROWS = 150
TABLE = "kv"
WRITER = "load"
CALL_TIMEOUT_S = 60


def batch(sequence: int) -> tuple[str, pa.Table]:
    if sequence % 7 == 6:
        keys = [(sequence * 31 + 5 * i) % KEYS for i in range(ROWS // 5)]
        return "delete", pa.table({"k": pa.array(keys, pa.int64())})
    keys = [(sequence * 41 + i) % KEYS for i in range(ROWS)]
    return "upsert", pa.table({"k": pa.array(keys, pa.int64()),
                               "seq": pa.array([sequence] * ROWS, pa.int64()),
                               "pad": [f"{sequence:08d}" + "y" * 60] * ROWS})


def fold(last: int) -> dict[int, int]:
    state: dict[int, int] = {}
    for sequence in range(last + 1):
        kind, data = batch(sequence)
        for k in data.column("k").to_pylist():
            if kind == "delete":
                state.pop(k, None)
            else:
                state[k] = sequence
    return state


def start_server(data_dir: Path) -> ForkedServer:
    """The real ``serve`` command, forked from a fork server that imported flightstore once (six
    starts here); ``--no-fsync``: kill -9 keeps the page cache, so what is written survives."""
    return ForkedServer(data_dir, "--no-fsync")


class Writer:
    """Sends batch ``sequence`` with writer id and sequence: a retry after a crash is applied once."""

    def __init__(self, uri: str) -> None:
        self.conn = flightstore.connect(uri, timeout=CALL_TIMEOUT_S)

    def send(self, sequence: int) -> None:
        kind, data = batch(sequence)
        payload = {"op": kind, "table": TABLE, "columns": None, "writer_id": WRITER, "sequence": sequence}
        self.conn._put(payload, data)

    def snapshot(self, force: bool = False) -> dict:
        return self.conn.table(TABLE).snapshot(force)

    def usage(self) -> dict:
        return self.conn.table(TABLE).usage()

    def close(self) -> None:
        self.conn.close()


def test_steady_updates_keep_disk_bounded_and_survive_kill_minus_nine(tmp_path):
    data_dir = tmp_path / "data"
    rng = random.Random(7)
    server = start_server(data_dir)
    writer = Writer(server.uri)
    writer.conn.sql(f"CREATE TABLE {TABLE} (k BIGINT, seq BIGINT, pad STRING, PRIMARY KEY (k) NOT ENFORCED) "
                    "WITH ('bucket.num' = '2', 'table.log.ttl' = '1ms', 'table.log.segment.bytes' = '16384', "
                    "'kv.snapshot.interval' = '100ms', 'kv.snapshot.num-retained' = '2')")
    sequence = 0
    explicit_snapshots = 0

    def rounds(count: int) -> None:
        nonlocal sequence
        for _ in range(count):
            writer.send(sequence)
            sequence += 1

    def settled_usage() -> dict:
        """Disk use right after two snapshots and retention (taken on request, so each measurement
        sees the same phase of the cycle: the oldest retained snapshot is the current state)."""
        nonlocal explicit_snapshots
        writer.snapshot(force=True)
        writer.snapshot(force=True)
        explicit_snapshots += 2
        return writer.usage()

    # ---- a steady load: disk use does not grow with the number of updates ----------------------
    rounds(150)
    first = settled_usage()
    rounds(300)
    second = settled_usage()
    assert all(offset > 0 for offset in second["start_offsets"].values()), second
    written = sum(second["end_offsets"].values())
    held = sum(second["end_offsets"][b] - second["start_offsets"][b] for b in second["end_offsets"])
    assert held < written / 4, f"the changelog holds {held} of {written} rows"
    # The changelog is what grows with every update; RocksDB's own files (its info log and MANIFEST,
    # bounded by their roll sizes) may still grow a little towards their caps.
    assert second["bytes"]["log"] <= 2 * first["bytes"]["log"] + 64 * 1024, (first, second)
    assert second["bytes"]["total"] < first["bytes"]["total"] + 2 * 1024 * 1024, (first, second)
    ids = {b: s["id"] for b, s in writer.snapshot().items()}
    explicit_snapshots += 1
    assert min(ids.values()) > explicit_snapshots, "the server's interval took no snapshots"

    # ---- kill -9 the server at random moments, restart, keep writing -----------------------------
    acked = sequence - 1
    for _ in range(4):
        target = acked + rng.randint(20, 80)
        killer = None
        while True:
            try:
                writer.send(sequence)
            except flight.FlightError:
                break  # the server died under this write: it is unacknowledged
            acked = sequence
            sequence += 1
            if acked >= target and killer is None:
                killer = threading.Timer(rng.uniform(0.0, 0.03), server.kill)
                killer.start()
        killer.join(timeout=30)
        writer.close()
        server.process.join(timeout=30)
        server = start_server(data_dir)
        writer = Writer(server.uri)
        # The batch in flight when the server died is retried: applied once either way.
        writer.send(sequence)
        acked = sequence
        sequence += 1
    # A last kill in the middle of the load, without a retry.
    killer = threading.Timer(rng.uniform(0.0, 0.03), server.kill)
    killer.start()
    while True:
        try:
            writer.send(sequence)
        except flight.FlightError:
            break
        acked = sequence
        sequence += 1
    killer.join(timeout=30)
    writer.close()
    server.process.join(timeout=30)

    server = start_server(data_dir)
    try:
        with flightstore.connect(server.uri, timeout=CALL_TIMEOUT_S) as conn:
            table = conn.table(TABLE)
            applied = conn._action("flightstore.writer", {"table": TABLE, "writer_id": WRITER})["sequence"]
            assert applied in (acked, acked + 1)  # the write in flight is all or nothing
            rows = table.scan(["k", "seq"]).to_pylist()
            assert {r["k"]: r["seq"] for r in rows} == fold(applied)
            assert len(rows) == len(fold(applied))
            usage = table.usage()
            assert all(offset > 0 for offset in usage["start_offsets"].values())
    finally:
        server.stop()
