"""Kill -9 a real writer process at random moments; nothing acknowledged is lost or doubled."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from flightstore.store import Store
from tests.forked_server import ForkedModule
from tests.kv.crash_writer import ROWS, batch
from tests.kv.fold import fold_changelog, kv_contents

ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(data_dir: Path, first: int, rng: random.Random) -> int | None:
    """Start the writer, kill -9 it once it acknowledged a random number of new batches (plus a
    random few milliseconds, to land anywhere inside a batch); return the last acknowledged
    sequence. Tied to progress, not to a clock: a busy machine only makes the run slower."""
    child = ForkedModule("tests.kv.crash_writer", str(data_dir), str(first), cwd=ROOT)
    acked: list[int] = []
    progressed = threading.Condition()
    wanted = rng.randint(1, 6)

    def reader() -> None:
        for line in child.stdout:
            if line.strip().isdigit():
                with progressed:
                    acked.append(int(line))
                    progressed.notify_all()

    assert child.stdout.readline().strip() == "ready"
    thread = threading.Thread(target=reader)
    thread.start()
    with progressed:
        assert progressed.wait_for(lambda: len(acked) >= wanted or child.poll() is not None, timeout=120), \
            "the writer acknowledged nothing within 120 s"
    time.sleep(rng.uniform(0, 0.02))  # where inside the next batch the kill lands, not a wait
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join()
    return acked[-1] if acked else None


@pytest.mark.slow
def test_kill_minus_nine_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(1234)
    data_dir = tmp_path / "data"
    last_acked = -1
    for _ in range(12):
        acked = run_and_kill(data_dir, last_acked + 1, rng)
        if acked is not None:
            last_acked = acked
    assert last_acked > 10, "the writer made too little progress to test anything"
    with Store(data_dir) as store:
        events = store.table("events").scan_table()
        counts = pc.value_counts(events.column("seq")).to_pylist()
        per_seq = {c["values"]: c["counts"] for c in counts}
        # Every acknowledged batch is there exactly once; an unacknowledged one is all or nothing.
        for sequence in range(last_acked + 1):
            assert per_seq.get(sequence) == ROWS, f"batch {sequence}: {per_seq.get(sequence)} rows"
        assert set(per_seq) <= set(range(last_acked + 2))
        assert per_seq.get(last_acked + 1, ROWS) == ROWS
        kv = store.table("kv")
        state = kv_contents(kv, ["k"])
        assert state == fold_changelog(kv, ["k"])
        assert kv.row_count() == len(state)
        # The KV holds, for every key, the latest acknowledged (or the one in-flight) batch.
        expected: dict = {}
        applied_last = kv.writer_sequence("crash")
        assert applied_last in (last_acked, last_acked + 1)
        for sequence in range(applied_last + 1):
            pk, _ = batch(sequence)
            for k in pk.column("k").to_pylist():
                expected[k] = sequence
        assert {k[0]: row["seq"] for k, row in state.items()} == expected
