"""kill -9 inside a KV snapshot, at every phase and at random moments, while a writer keeps writing:
the restart keeps every acknowledged write, publishes only complete snapshots, and a KV rebuilt
from the newest surviving snapshot (the previous one when the crash came before the new one was
published) plus the log tail equals the fold of the writes, although the log before it is gone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flightstore.store import Store
from tests.kv.snapshot_crash_writer import WRITER, fold

ROOT = Path(__file__).resolve().parents[2]
POINTS = ["checkpoint", "image", "publish-before", "publish-after", "prune", "prune-midway", "timer"]
SEEDS = [11, 23]


def contents(table) -> dict[int, int]:
    return {r["k"]: r["seq"] for r in table.scan_table(["k", "seq"]).to_pylist()}


def run_child(data_dir: Path, point: str, seed: int) -> tuple[int, dict, bool]:
    """Run the writer until it kills itself (or, if its crash point never fires, until we kill it
    after the snapshot); return the last acknowledged sequence, the pre-crash state and whether the
    snapshot finished."""
    child = subprocess.Popen([sys.executable, "-m", "tests.kv.snapshot_crash_writer", str(data_dir), point,
                              str(seed)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    acked, before, done = -1, None, False
    try:
        for line in child.stdout:
            line = line.strip()
            if line.isdigit():
                acked = int(line)
            elif line.startswith("before "):
                before = json.loads(line[len("before "):])
            elif line == "snapshot-done":
                done = True
                child.kill()  # SIGKILL: the writer thread is still writing
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == -9, f"the writer ended with {child.returncode}, not a kill -9"
    assert before is not None, "the writer died before the crash point"
    return acked, before, done


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_kill_minus_nine_inside_a_snapshot_loses_nothing(tmp_path, point):
    for seed in SEEDS:
        data_dir = tmp_path / f"seed-{seed}"
        acked, before, done = run_child(data_dir, point, seed)
        if point in ("checkpoint", "image", "publish-before"):
            assert not done
        with Store(data_dir) as store:
            table = store.table("kv")
            applied = table.writer_sequence(WRITER)
            assert applied in (acked, acked + 1)  # the batch in flight is all or nothing
            expected = fold(applied)
            assert contents(table) == expected
            for bucket, kv in enumerate(table.kvs):
                snapshots = kv.snapshots
                newest = snapshots.newest.id
                # Only complete snapshots survive; the crashed one is there only if it was published.
                assert newest in (before[str(bucket)]["newest"], before[str(bucket)]["newest"] + 1)
                if point in ("checkpoint", "image", "publish-before") and bucket == 0:
                    assert newest == before[str(bucket)]["newest"]
                assert sorted(p.name for p in snapshots.directory.iterdir()) == \
                    sorted(s.directory.name for s in snapshots.list())  # leftovers cleaned
                assert len(snapshots.list()) <= 2
                assert table.logs[bucket].start_offset > 0  # the log before the snapshots is gone
                assert table.logs[bucket].start_offset <= snapshots.retention_floor()
            kv_dirs = [kv.directory for kv in table.kvs]
            newest_ids = [kv.snapshots.newest.id for kv in table.kvs]
        for directory in kv_dirs:  # lose the live KV: only the snapshot and the tail can restore it
            shutil.rmtree(directory)
        with Store(data_dir) as store:
            table = store.table("kv")
            assert [kv.recovered_from for kv in table.kvs] == [f"snapshot {n}" for n in newest_ids]
            assert contents(table) == expected
            assert table.row_count() == len(expected)

