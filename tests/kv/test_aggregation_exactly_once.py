"""Exactly-once aggregation for jobs that fail and restart (undo recovery), for client writers
while the server is killed -9 and restarted, and column ownership."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyarrow import flight

import flightstore
from flightstore import changetype
from flightstore.errors import InvalidInput, Unsupported, WriterConflict
from flightstore.kv import undo as undo_module
from flightstore.kv.ownership import (
    ColumnOwnership,
    claim_columns,
    ownership_of,
    release_columns,
)
from flightstore.store import Store
from tests.forked_server import ForkedModule, fork_context
from tests.kv import agg_writer, crash_writer
from tests.kv.fold import fold_changelog, kv_contents
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


# ---- the kill test -------------------------------------------------------------------------

def run_writer(data_dir: Path, checkpoint: tuple[int, int], seed: int,
               kill_after: float | None) -> tuple[tuple[int, int], bool]:
    """Run the job from ``checkpoint``; SIGKILL it ``kill_after`` s after its first new checkpoint
    (tied to progress, not to the clock: a fast machine still gets killed mid-stream).
    Returns (last checkpoint, whether it finished)."""
    child = ForkedModule("tests.kv.agg_writer", str(data_dir), str(checkpoint[0]), str(checkpoint[1]), str(seed),
                         cwd=ROOT)
    lines: list[str] = []
    checkpointed = threading.Event()

    def read() -> None:
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("checkpoint"):
                checkpointed.set()

    reader = threading.Thread(target=read)
    reader.start()
    if kill_after is not None:
        checkpointed.wait(timeout=60)
        time.sleep(kill_after)
        os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    reader.join()
    for line in lines:
        if line.startswith("checkpoint"):
            _, sequence, position = line.split()
            checkpoint = (int(sequence), int(position))
    return checkpoint, "done" in lines


def expected_aggregates() -> dict:
    state: dict = {}
    for i in range(agg_writer.TOTAL_EVENTS):
        e = agg_writer.event(i)
        row = state.setdefault(e["user"], {"user": e["user"], "total": 0, "top": None, "events": 0,
                                           "ids": None})
        row["total"] += e["total"]
        row["top"] = e["top"] if row["top"] is None else max(row["top"], e["top"])
        row["events"] += 1
        row["ids"] = e["ids"] if row["ids"] is None else row["ids"] + " " + e["ids"]
    return state


def test_killed_job_restarting_from_its_checkpoint_aggregates_every_event_once(tmp_path):
    rng = random.Random(7)
    data_dir = tmp_path / "data"
    checkpoint, kills = (-1, 0), 0
    for seed in range(6):
        checkpoint, done = run_writer(data_dir, checkpoint, seed, rng.uniform(0.0, 0.05))
        kills += not done
    assert kills >= 3, "the job finished too fast to be killed"
    checkpoint, done = run_writer(data_dir, checkpoint, 99, None)
    assert done and checkpoint[1] == agg_writer.TOTAL_EVENTS
    with Store(data_dir) as store:
        table = store.table("stats")
        state = {k[0]: row for k, row in kv_contents(table, ["user"]).items()}
        assert state == expected_aggregates()
        assert kv_contents(table, ["user"]) == fold_changelog(table, ["user"])


# ---- kill -9 of the server under 8 client writers -----------------------------------------

WRITERS = 8
KILLS = 6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _expected_stats(acked: list[int]) -> dict:
    """The aggregation table after exactly the acknowledged batches (listagg ids as a sorted list:
    writers interleave)."""
    state: dict = {}
    for writer, batches in enumerate(acked):
        for sequence in range(batches):
            for e in crash_writer.client_batch(writer, sequence)[0].to_pylist():
                row = state.setdefault(e["user"], {"user": e["user"], "total": 0, "top": None,
                                                   "events": 0, "ids": []})
                row["total"] += e["total"]
                row["top"] = e["top"] if row["top"] is None else max(row["top"], e["top"])
                row["events"] += 1
                row["ids"].append(e["ids"])
    return {user: {**row, "ids": sorted(row["ids"])} for user, row in state.items()}


@pytest.mark.slow
def test_client_writers_apply_every_acknowledged_batch_once_across_server_kills(tmp_path):
    """Issue 20 item 3: 8 writer processes (writer ids) write an aggregation table and a
    multi-bucket log table while the server is killed -9 and restarted 6 times; every batch
    acknowledged is applied exactly once (sums exact, each event id and log row once)."""
    ctx = fork_context()
    data_dir, port, rng = str(tmp_path / "data"), _free_port(), random.Random(20)
    uri = f"grpc://127.0.0.1:{port}"
    server = ctx.Process(target=crash_writer.serve_process, args=(data_dir, port), daemon=True)
    server.start()
    acked, stop, failures = ctx.Array("q", WRITERS), ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=crash_writer.client_writer_process, args=(uri, w, acked, stop, failures),
                           daemon=True) for w in range(WRITERS)]
    try:
        with flightstore.connect(uri) as conn:
            wait_until(lambda: _answers(conn), "the server answering")
            conn.sql("CREATE TABLE stats (user BIGINT, total BIGINT, top BIGINT, events BIGINT, ids STRING, "
                     "PRIMARY KEY (user) NOT ENFORCED) WITH (" + ", ".join(
                         f"'{k}' = '{v}'" for k, v in agg_writer.OPTIONS.items()) + ")")
            conn.sql("CREATE TABLE events (seq BIGINT, i BIGINT) WITH ('bucket.num' = '4', 'bucket.key' = 'i')")
        for writer in writers:
            writer.start()
        for _ in range(KILLS):
            target = sum(acked) + rng.randint(WRITERS, 3 * WRITERS)  # progress since the last restart
            wait_until(lambda: sum(acked) >= target or not failures.empty(), "the writers making progress")
            time.sleep(rng.uniform(0, 0.02))  # where inside the writes the kill lands, not a wait
            os.kill(server.pid, signal.SIGKILL)
            server.join(timeout=60)
            # Down as long as a real restart takes (1.3-2.8 s measured with `flightstore serve`; a
            # process forked from the preloaded fork server starts in a fraction of that).
            time.sleep(rng.uniform(1.3, 2.8))
            server = ctx.Process(target=crash_writer.serve_process, args=(data_dir, port), daemon=True)
            server.start()
        target = sum(acked) + WRITERS
        wait_until(lambda: sum(acked) >= target or not failures.empty(), "progress after the last restart")
        stop.set()
        for writer in writers:
            writer.join(timeout=180)
        assert failures.empty(), failures.get()
        assert [w.exitcode for w in writers] == [0] * WRITERS
    finally:
        stop.set()
        for process in (*writers, server):
            if process.is_alive():
                process.kill()
                process.join(timeout=60)
    counts = list(acked)
    assert min(counts) > 0, counts
    with Store(data_dir) as store:
        stats = store.table("stats")
        state = {k[0]: {**row, "ids": sorted(row["ids"].split(" "))} for k, row in kv_contents(stats, ["user"]).items()}
        assert state == _expected_stats(counts)  # nothing lost, nothing doubled
        assert kv_contents(stats, ["user"]) == fold_changelog(stats, ["user"])
        logged = store.table("events").scan_table()
        per_batch = {c["values"]: c["counts"] for c in pc.value_counts(logged.column("seq")).to_pylist()}
        assert per_batch == {w * 1_000_000 + s: crash_writer.CLIENT_EVENTS
                             for w, batches in enumerate(counts) for s in range(batches)}


def _answers(conn) -> bool:
    try:
        conn.sql("SELECT 1")
        return True
    except flight.FlightError:
        return False


# ---- undo, step by step -----------------------------------------------------------------------

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.string())])
OPTIONS = {"table.merge-engine": "aggregation", "fields.n.agg": "sum", "fields.s.agg": "listagg",
           "bucket.num": 2}


def events(*pairs) -> pa.Table:
    return pa.table({"k": pa.array([p[0] for p in pairs], pa.int64()),
                     "n": pa.array([p[1] for p in pairs], pa.int64()),
                     "s": pa.array([str(p[1]) for p in pairs])})


def state(table) -> dict:
    return {r["k"]: (r["n"], r["s"]) for r in table.scan_table().to_pylist()}


def test_undo_keeps_other_writers_sums(store):
    """Issue 10 #7: A writes +10 (seq 0) and +5 (seq 1), B writes +100; undo(A, 0) leaves 110."""
    table = store.create_table("t", SCHEMA.remove(2), primary_key=["k"],
                               options={"table.merge-engine": "aggregation", "fields.n.agg": "sum"})
    one = {"k": pa.array([1], pa.int64())}
    table.upsert(pa.table({**one, "n": pa.array([10], pa.int64())}), writer_id="A", sequence=0)
    table.upsert(pa.table({**one, "n": pa.array([5], pa.int64())}), writer_id="A", sequence=1)
    table.upsert(pa.table({**one, "n": pa.array([100], pa.int64())}), writer_id="B", sequence=0)
    assert table.undo("A", 0) == 1
    assert table.lookup(one).to_pylist() == [{"k": 1, "n": 110}]
    assert table.writer_sequence("A") == 0 and table.writer_sequence("B") == 0
    table.upsert(pa.table({**one, "n": pa.array([5], pa.int64())}), writer_id="A", sequence=1)
    assert table.lookup(one).to_pylist() == [{"k": 1, "n": 115}]
    assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])


def test_undo_restores_before_images_and_accepts_the_replay(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
    table.upsert(events((1, 1), (2, 2)), writer_id="w", sequence=0)
    table.upsert(events((1, 10), (3, 3)), writer_id="w", sequence=1)
    table.upsert(events((4, 4)), writer_id="other", sequence=0)
    table.upsert(events((1, 100), (2, 20)), writer_id="w", sequence=2)
    assert table.undo("w", 0) > 0
    # Only w wrote keys 1, 2 and 3 since its checkpoint: their before-images come back (3: absent).
    assert state(table) == {1: (1, "1"), 2: (2, "2"), 4: (4, "4")}
    assert table.writer_sequence("w") == 0
    assert table.undo("w", 0) == 0  # idempotent
    table.upsert(events((1, 5)), writer_id="w", sequence=1)
    assert state(table)[1] == (6, "1,5")
    assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])
    store.close()
    with Store(store.data_dir) as again:  # the reset sequence and the fence are durable
        reopened = again.table("t")
        reopened.upsert(events((1, 5)), writer_id="w", sequence=1)  # a retry: skipped
        assert reopened.writer_sequence("w") == 1 and state(reopened)[1] == (6, "1,5")


def test_undo_refuses_a_key_another_writer_changed_through_a_non_invertible_field(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
    table.upsert(events((1, 1)), writer_id="w", sequence=0)
    table.upsert(events((1, 10), (3, 3), (5, 5)), writer_id="w", sequence=1)
    table.upsert(events((3, 30)), writer_id="other", sequence=0)  # s is a listagg: "3,30"
    before, offsets = state(table), table.end_offsets()
    with pytest.raises(InvalidInput, match=r"cannot undo writer 'w': key\(s\) 3 were written by other "
                       r"writers after it, and field\(s\) 's' \(listagg\)"):
        table.undo("w", 0)
    assert state(table) == before and table.end_offsets() == offsets  # nothing written
    assert table.writer_sequence("w") == 1


def test_undo_of_a_later_epoch_leaves_undone_records_alone(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
    table.upsert(events((1, 1)), writer_id="w", sequence=0)
    table.upsert(events((1, 2)), writer_id="w", sequence=1)
    table.upsert(events((1, 3)), writer_id="w", sequence=2)
    table.undo("w", 0)
    table.upsert(events((1, 20)), writer_id="w", sequence=1)
    table.upsert(events((1, 30)), writer_id="w", sequence=2)
    table.upsert(events((1, 40)), writer_id="w", sequence=3)
    table.undo("w", 1)  # undoes only the second epoch's batches 2 and 3
    assert state(table) == {1: (21, "1,20")}
    with pytest.raises(InvalidInput, match="already undone to sequence 1"):
        table.undo("w", 0)


def test_undo_interrupted_before_its_fence_is_repeated_harmlessly(store, monkeypatch):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=OPTIONS)
    table.upsert(events((1, 1), (2, 2)), writer_id="w", sequence=0)
    table.upsert(events((1, 10), (5, 5)), writer_id="w", sequence=1)
    table.upsert(events((1, 100), (2, 20)), writer_id="w", sequence=2)
    real = undo_module._settle

    def crash(*args):
        raise RuntimeError("killed")

    monkeypatch.setattr(undo_module, "_settle", crash)
    with pytest.raises(RuntimeError):
        table.undo("w", 0)
    monkeypatch.setattr(undo_module, "_settle", real)
    table.undo("w", 0)
    table.undo("w", 0)
    assert state(table) == {1: (1, "1"), 2: (2, "2")}
    assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])


def test_undo_refusals(store):
    wal = store.create_table("wal", SCHEMA, primary_key=["k"],
                             options={**OPTIONS, "table.changelog.image": "WAL"})
    with pytest.raises(InvalidInput, match="'table.changelog.image' = 'FULL'"):
        wal.undo("w", 0)
    log = store.create_table("log", SCHEMA)
    with pytest.raises(Unsupported):
        log.undo("w", 0)


def test_undo_restores_deleted_rows_of_a_last_row_table(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"])
    table.upsert(events((1, 1), (2, 2)), writer_id="w", sequence=0)
    table.delete({"k": [1]}, writer_id="w", sequence=1)
    table.write(events((2, 9)), np.array([changetype.UPDATE_AFTER], np.int8), writer_id="w", sequence=2)
    table.undo("w", 0)
    assert state(table) == {1: (1, "1"), 2: (2, "2")}


# ---- column ownership -------------------------------------------------------------------------

WIDE = pa.schema([("user", pa.int64()), ("clicks", pa.int64()), ("last_order_ts", pa.int64())])
WIDE_OPTIONS = {"table.merge-engine": "aggregation", "fields.clicks.agg": "sum",
                "fields.last_order_ts.agg": "max", "bucket.num": 2}


def test_writers_on_disjoint_columns_run_concurrently_and_conflicts_name_the_owner(store):
    table = store.create_table("wide", WIDE, primary_key=["user"], options=WIDE_OPTIONS)
    errors: list[BaseException] = []

    def job(writer: str, column: str, value) -> None:
        try:
            for sequence in range(40):
                users = pa.array([(sequence + i) % 25 for i in range(10)], pa.int64())
                data = pa.table({"user": users, column: pa.array([value(sequence)] * 10, pa.int64())})
                table.upsert(data, ["user", column], writer_id=writer, sequence=sequence)
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=job, args=("clicks-job", "clicks", lambda s: 1)),
               threading.Thread(target=job, args=("orders-job", "last_order_ts", lambda s: 1000 + s))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    rows = {r["user"]: r for r in table.scan_table().to_pylist()}
    assert sum(r["clicks"] for r in rows.values()) == 400 and len(rows) == 25
    assert all(r["last_order_ts"] == max(1000 + s for s in range(40) if (r["user"] - s) % 25 < 10)
               for r in rows.values())
    with pytest.raises(WriterConflict, match="column 'clicks' is owned by live writer 'clicks-job'"):
        table.upsert(pa.table({"user": [1], "clicks": [5]}), ["user", "clicks"], writer_id="late")
    assert table.lookup({"user": [1]}).to_pylist()[0]["clicks"] == rows[1]["clicks"]
    release_columns(table, "clicks-job")
    table.upsert(pa.table({"user": [1], "clicks": [5]}), ["user", "clicks"], writer_id="late")
    assert ownership_of(table).owner("clicks") == "late"
    assert ownership_of(table).owner("user") is None  # key columns are shared


def test_claims_expire_without_heartbeat():
    now = [0.0]
    ownership = ColumnOwnership(default_ttl=10, clock=lambda: now[0])
    ownership.claim("a", ["x", "y"])
    now[0] = 8
    assert ownership.heartbeat("a")
    now[0] = 15
    with pytest.raises(WriterConflict, match="column 'x'"):
        ownership.claim("b", ["x"])
    ownership.claim("a", ["z"])  # re-claiming extends one's own claim
    assert ownership.claims() == {"a": frozenset({"x", "y", "z"})}
    now[0] = 26
    ownership.claim("b", ["x"])  # a's claim expired: taken over
    assert not ownership.heartbeat("a") and ownership.owner("x") == "b"
    ownership.release("b", ["x"])
    assert ownership.claims() == {}


def test_claim_columns_checks_the_table(store):
    table = store.create_table("wide", WIDE, primary_key=["user"], options=WIDE_OPTIONS)
    with pytest.raises(InvalidInput, match="no column"):
        claim_columns(table, "w", ["nope"])
