"""Child process of the snapshot crash test: writes, takes KV snapshots, and kills itself with
SIGKILL at a chosen point inside a snapshot while a writer thread keeps writing.

Usage: python -m tests.kv.snapshot_crash_writer DATA_DIR CRASH_POINT SEED

Prints ``ready``, one line per acknowledged batch sequence, ``before {json}`` (the newest snapshot
id and log start offset of every bucket) just before the snapshot that crashes, and
``snapshot-done`` if it finished (the crash point did not fire). The kill is a real ``kill -9`` of
this process, fired from inside the snapshot code path by wrapping the functions it calls, so every
phase is reached deterministically: while the checkpoint is taken (``checkpoint``), after ``k`` rows
of the image (``image``), just before or after the snapshot is published by its rename
(``publish-before``, ``publish-after``), after the previous snapshot was renamed for deletion
(``prune``), in the middle of deleting it (``prune-midway``), or after a random delay (``timer``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
from pathlib import Path

import pyarrow as pa

import flightstore.kv.image as image_module
import flightstore.kv.snapshot as snapshot_module
import flightstore.kv.tablet as tablet_module
from flightstore.store import Store

SCHEMA = pa.schema([("k", pa.int64()), ("seq", pa.int64()), ("pad", pa.string())])
KEYS = 3000
ROWS = 120
OPTIONS = {"bucket.num": 2, "table.log.ttl": "1ms", "table.log.segment.bytes": 8192,
           "kv.snapshot.num-retained": 2}
WRITER = "w"


def batch(sequence: int) -> tuple[str, pa.Table]:
    """Batch ``sequence``: every fifth one deletes some keys, the others upsert ROWS keys."""
    if sequence % 5 == 4:
        keys = [(sequence * 53 + 17 * i) % KEYS for i in range(ROWS // 4)]
        return "delete", pa.table({"k": pa.array(keys, pa.int64())})
    keys = [(sequence * 37 + i) % KEYS for i in range(ROWS)]
    return "upsert", pa.table({"k": pa.array(keys, pa.int64()),
                               "seq": pa.array([sequence] * ROWS, pa.int64()),
                               "pad": [f"{sequence}-" + "x" * 40] * ROWS}, schema=SCHEMA)


def fold(last: int) -> dict[int, int]:
    """{key: seq} after batches 0..last."""
    state: dict[int, int] = {}
    for sequence in range(last + 1):
        kind, data = batch(sequence)
        for k in data.column("k").to_pylist():
            if kind == "delete":
                state.pop(k, None)
            else:
                state[k] = sequence
    return state


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, rng: random.Random) -> None:
    """Arrange for SIGKILL at ``point`` of the next snapshot."""
    if point == "checkpoint":
        real = tablet_module.Checkpoint

        class Dying:
            def __init__(self, db):
                self._real = real(db)

            def create_checkpoint(self, path):
                self._real.create_checkpoint(path)
                _die()  # inside the tablet's write lock, the checkpoint written, nothing else

        tablet_module.Checkpoint = Dying
    elif point == "image":
        real_write = snapshot_module.write_image
        after = rng.randrange(0, 2 * KEYS // OPTIONS["bucket.num"])

        def write(path, values, *args, **kwargs):
            def dying():
                for i, item in enumerate(values):
                    if i == after:
                        _die()
                    yield item
                _die()  # fewer rows than ``after``: die at the end of the image
            return real_write(path, dying(), *args, **kwargs)

        snapshot_module.write_image = write
    elif point in ("publish-before", "publish-after", "prune"):
        real_rename = os.rename

        def rename(src, dst, *args, **kwargs):
            publishing = "snapshots" in str(src) and str(src).endswith(".tmp")
            if publishing and point == "publish-before":
                _die()
            real_rename(src, dst, *args, **kwargs)
            pruning = str(dst).endswith(".deleting")
            if (publishing and point == "publish-after") or (pruning and point == "prune"):
                _die()

        os.rename = rename
    elif point == "prune-midway":
        real_rmtree = shutil.rmtree

        def rmtree(path, *args, **kwargs):
            if str(path).endswith(".deleting"):
                files = sorted(p for p in Path(path).rglob("*") if p.is_file())
                for file in files[: max(1, len(files) // 2)]:
                    file.unlink()
                _die()
            return real_rmtree(path, *args, **kwargs)

        snapshot_module.shutil.rmtree = rmtree
    elif point == "timer":
        timer = threading.Timer(rng.uniform(0.0, 0.4), _die)
        timer.daemon = True
        timer.start()
    else:
        raise SystemExit(f"unknown crash point {point}")


def main() -> None:
    data_dir, point, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    image_module.IMAGE_BATCH_ROWS = 97  # many image batches from few rows: kill points inside the image
    with Store(data_dir) as store:
        table = store.create_table("kv", SCHEMA, primary_key=["k"], options=OPTIONS)
        print("ready", flush=True)
        sequence = 0

        def write() -> None:
            nonlocal sequence
            kind, data = batch(sequence)
            if kind == "delete":
                table.delete(data, writer_id=WRITER, sequence=sequence)
            else:
                table.upsert(data, writer_id=WRITER, sequence=sequence)
            print(sequence, flush=True)
            sequence += 1

        for _ in range(3):  # two retained snapshots, a truncated log, and a tail after them
            for _ in range(rng.randint(25, 40)):
                write()
            table.snapshot()
            table.enforce_retention()
        for _ in range(rng.randint(5, 20)):
            write()
        state = {b: {"newest": kv.snapshots.newest.id, "start": table.logs[b].start_offset}
                 for b, kv in enumerate(table.kvs)}
        print("before " + json.dumps(state), flush=True)

        stop = threading.Event()

        def keep_writing() -> None:
            while not stop.is_set():
                write()

        writer = threading.Thread(target=keep_writing, daemon=True)
        writer.start()
        install(point, rng)
        table.snapshot(force=True)
        table.enforce_retention()
        print("snapshot-done", flush=True)
        writer.join()  # writes until the test kills this process


if __name__ == "__main__":
    main()
