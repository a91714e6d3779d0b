"""kill -9 a process that ALTERs tables, adds and drops partitions and writes across partitions:
after every crash the catalog holds the old or the new schema (never a mix), every row reads back
under it (NULL in columns added after the row was written), acknowledged writes are there exactly
once, an unacknowledged one is all or nothing across its partitions, and partition directories
match the catalog."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from flightstore.partitioned import partition_directory
from flightstore.store import Store
from tests.alter_crash_writer import ROWS, partitions_of
from tests.forked_server import ForkedModule
from tests.kv.fold import fold_changelog, kv_contents

ROOT = Path(__file__).resolve().parents[1]


def run_and_kill(data_dir: Path, first: int, rng: random.Random, tries: dict[int, set[int]]
                 ) -> tuple[list[tuple[int, int]], int]:
    """Run the child until it acknowledged a random number of steps, kill -9 it a random moment
    later; return the acknowledged (step, added columns) and the last acknowledged ALTER. ``tries``
    collects the added-column counts each step was tried with."""
    child = ForkedModule("tests.alter_crash_writer", str(data_dir), str(first), cwd=ROOT)
    acked: list[tuple[int, int]] = []
    alters = [0]
    progressed = threading.Condition()
    wanted = rng.randint(1, 7)

    def reader() -> None:
        for line in child.stdout:
            words = line.split()
            with progressed:
                if words[:1] == ["try"]:
                    tries.setdefault(int(words[1]), set()).add(int(words[2]))
                elif words[:1] == ["ack"]:
                    acked.append((int(words[1]), int(words[2])))
                elif words[:1] == ["alter"]:
                    alters.append(int(words[1]))
                progressed.notify_all()

    assert child.stdout.readline().strip() == "ready"
    thread = threading.Thread(target=reader)
    thread.start()
    with progressed:
        assert progressed.wait_for(lambda: len(acked) >= wanted or child.poll() is not None, timeout=120), \
            "the child acknowledged nothing within 120 s"
    time.sleep(rng.uniform(0, 0.05))  # lands anywhere inside the next write or ALTER
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    thread.join(timeout=60)
    return acked, max(alters)


def _check(store: Store, acked: dict[int, int], last_alter: int, tries: dict[int, set[int]]) -> None:
    for name in ("default.pk", "default.lg"):
        table = store.table(name)
        added = [c for c in table.schema.names if c.startswith("c")]
        assert added == [f"c{j}" for j in range(1, len(added) + 1)], table.schema.names  # old or new schema
        assert len(added) >= last_alter
        assert table.descriptor.version == len(added) + 1
        rows = table.scan_table().to_pylist()
        for row in rows:  # each row: its step in v, and c<j> = v exactly for the columns it was written with
            written = [j for j in range(1, len(added) + 1) if row[f"c{j}"] is not None]
            assert written == list(range(1, len(written) + 1)) and all(row[f"c{j}"] == row["v"] for j in written)
            assert len(written) in tries[row["v"]], (name, row)  # the columns of one try of its step
        on_disk = {p.name for p in table.directory.glob("p-*")}
        assert on_disk == {partition_directory(table.directory, p.id).name for p in table.descriptor.partitions}
        if name == "default.lg":
            steps: dict[int, int] = {}
            for row in rows:
                steps[row["v"]] = steps.get(row["v"], 0) + 1
            for step in acked:
                assert steps.get(step) == 3 * ROWS, f"acknowledged step {step}: {steps.get(step)} rows"
            assert all(count == 3 * ROWS for count in steps.values())  # in-flight: all or nothing
        else:
            for unit in table.units.values():
                assert kv_contents(unit, ["dt", "k"]) == fold_changelog(unit, ["dt", "k"])
            latest: dict[str, int] = {}
            for step in sorted(acked):
                for day in partitions_of(step):
                    latest[day] = step
            for row in rows:
                assert row["v"] >= latest.get(row["dt"], -1)  # nothing acknowledged was lost


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7])
def test_kill_minus_nine_during_alter_leaves_old_or_new_schema(tmp_path, seed):
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    acked: dict[int, int] = {}
    tries: dict[int, set[int]] = {}
    last_alter = 0
    for _ in range(10):
        first = max(acked, default=-1) + 1
        steps, alter = run_and_kill(data_dir, first, rng, tries)
        acked.update(dict(steps))
        last_alter = max(last_alter, alter)
        with Store(data_dir) as store:
            _check(store, acked, last_alter, tries)
    assert len(acked) > 12 and last_alter >= 3, "the child made too little progress to test anything"
