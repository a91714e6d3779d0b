"""Durability speed (issue 10): small writes from 16 concurrent writers through the server, with
the default fsync (group commit) vs the same server run with ``--no-fsync``.

The issue states this ratio (flightstore against itself by design): appends of 10 rows from 16
concurrent writers with fsync on reach >= 0.5x the appends/s with fsync off, because concurrent
writers share fsyncs. Primary-key upserts of 10 rows are measured the same way.

Both servers run at once, each in its own process on its own data directory, and 16 writer
processes (``bench/durability_writer.py``, each with a connection to both servers) write to one
server at a time, in interleaved rounds; each figure is its best round.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.bench_server import HERE, _start_server, _stop_server
from bench.report import Row
from flightstore.store import Store

WRITERS = 16
WRITES_PER_ROUND = 60  # per writer
ROUNDS = 5


def _build(data_dir: Path) -> None:
    with Store(data_dir, fsync=False) as store:
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
        store.create_table("lg", schema)
        store.create_table("pk", schema, primary_key=["id"])


def _round(writers: list[subprocess.Popen], server: int, op: str) -> float:
    start = time.perf_counter()
    for writer in writers:
        writer.stdin.write(f"go {server} {op} {WRITES_PER_ROUND}\n")
        writer.stdin.flush()
    for writer in writers:
        line = writer.stdout.readline()
        if line.strip() != "done":
            raise RuntimeError(f"a durability writer failed: {line!r}")
    return time.perf_counter() - start


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-durability-"))
    processes: list[subprocess.Popen] = []
    writers: list[subprocess.Popen] = []
    try:
        uris = []
        for name, flag in (("fsync", "--fsync"), ("no-fsync", "--no-fsync")):
            _build(root / name)
            process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir",
                                          str(root / name), "--port", "0", flag],
                                         "flightstore serving")
            processes.append(process)
            uris.append(uri)
        writers = [subprocess.Popen([sys.executable, "-m", "bench.durability_writer", str(n), *uris],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    cwd=HERE.parent) for n in range(WRITERS)]
        for writer in writers:
            if writer.stdout.readline().strip() != "ready":
                raise RuntimeError("a durability writer did not start")
        best: dict[tuple[str, int], float] = {}
        for op in ("append", "upsert"):
            for _ in range(ROUNDS):
                for server in (0, 1):
                    seconds = _round(writers, server, op)
                    best[op, server] = min(best.get((op, server), float("inf")), seconds)
        writes = WRITERS * WRITES_PER_ROUND
        return [
            Row(f"{WRITERS} writers x 10-row appends via server, fsync on", writes / best["append", 0],
                writes / best["append", 1], "writes/s", "same server, --no-fsync", goal=">=0.5x"),
            Row(f"{WRITERS} writers x 10-row PK upserts via server, fsync on",
                writes / best["upsert", 0], writes / best["upsert", 1], "writes/s",
                "same server, --no-fsync"),
        ]
    finally:
        for writer in writers:
            try:
                writer.stdin.write("quit\n")
                writer.stdin.flush()
                writer.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                writer.kill()
        for process in processes:
            _stop_server(process)
        shutil.rmtree(root, ignore_errors=True)
