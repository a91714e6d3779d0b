"""Full scans of a primary-key table (issue 12), each against a peer measured in the same run.

The same 1M rows x 5 columns are stored twice: in a primary-key table and in a log table. The PK
table is then scanned through our server (``SELECT * FROM pk`` over Flight SQL, every endpoint read
with ``pyarrow.flight``) in three states, each against ``SELECT * FROM lg`` of the same rows on the
same server, in interleaved rounds:

1. right after a KV snapshot: the scan reads the snapshot's columnar image (goal >= 0.5x);
2. after 10,000 upserts (1% of the keys) since the snapshot: image + the changelog tail;
3. before any snapshot (right after loading): the whole changelog folded vectorized (issue 20:
   was RocksDB iterated from Python, 0.03x; goal >= 0.5x).

One more row shows what a snapshot costs: checkpoint + image of the 1M rows vs raw rocksdict
iteration of the same rows (a read-only copy of the same RocksDB data).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import flight

from bench.bench_server import _sql_read, _start_server, _stop_server
from bench.report import Row, best_interleaved, best_of
from flightstore.catalog import read_table_dir
from flightstore.client import connect
from flightstore.kv.snapshot import open_checkpoint
from flightstore.store import Store

ROWS = 1_000_000
CHANGED = 10_000
BUCKETS = 4
BATCH = 100_000
ROUNDS = 7  # interleaved rounds; each figure is its best round


def _rows(start: int, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(start, start + n), pa.int64()),
        "user_id": pa.array(rng.integers(0, 100_000, n), pa.int64()),
        "amount": pa.array(rng.random(n) * 100),
        "status": pa.array(np.array(["new", "paid", "shipped", "done"])[rng.integers(0, 4, n)]),
        "ts": pa.array(rng.integers(1_600_000_000_000, 1_700_000_000_000, n),
                       pa.int64()).cast(pa.timestamp("ms")),
    })


def _build(data_dir: Path) -> None:
    options = {"bucket.num": BUCKETS}
    with Store(data_dir) as store:
        sample = _rows(0, 1, 0)
        pk = store.create_table("pk", sample.schema, primary_key=["id"], options=options)
        lg = store.create_table("lg", sample.schema, options={**options, "bucket.key": "id"})
        for start in range(0, ROWS, BATCH):
            part = _rows(start, BATCH, start)
            pk.upsert(part)
            lg.append(part)


def _scan_rows(uri: str, label: str, goal: str = "") -> Row:
    client = flight.FlightClient(uri)
    reads = {"pk": lambda: _sql_read(client, "SELECT * FROM pk"),
             "lg": lambda: _sql_read(client, "SELECT * FROM lg")}
    for name, read in reads.items():
        got = read()
        assert got == ROWS, f"{name}: {got} rows"
    best = best_interleaved(reads, ROUNDS)
    client.close()
    return Row(label, ROWS / best["pk"], ROWS / best["lg"], "rows/s",
               "SELECT * of the same rows in a log table, same server", goal=goal)


def _snapshot_cost(data_dir: Path, uri: str, tmp: Path) -> Row:
    """Our snapshot of the whole table vs raw iteration of the same RocksDB rows."""
    with connect(uri) as conn:
        started = time.perf_counter()
        taken = conn.table("pk").snapshot(force=True)
        ours = time.perf_counter() - started
    copies = []
    for bucket, info in taken.items():
        source = read_table_dir(data_dir, "pk") / f"bucket-{bucket}" / "snapshots" / f"{info['id']:020d}" / "db"
        copy = tmp / f"raw-{bucket}"
        shutil.copytree(source, copy)
        copies.append(open_checkpoint(copy))

    def iterate() -> int:
        return sum(1 for db in copies for _ in db.items())

    assert iterate() == ROWS
    peer = best_of(iterate, 2)
    for db in copies:
        db.close()
    return Row(f"  KV snapshot of {ROWS:,} rows (checkpoint + image), s", ours, peer, "s",
               "raw rocksdict items() of the same rows", higher_is_better=False)


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-pk-scan-"))
    try:
        started = time.perf_counter()
        _build(root / "data")
        print(f"bench_pk_scan: tables built in {time.perf_counter() - started:.1f}s", file=sys.stderr,
              flush=True)
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--port", "0"], "flightstore serving")
        try:
            rocksdb = _scan_rows(uri, f"PK scan without a snapshot (changelog folded), {ROWS:,} rows x 5",
                                 ">=0.5x")
            with connect(uri) as conn:
                conn.table("pk").snapshot()
            image = _scan_rows(uri, f"Full PK scan {ROWS:,} rows x 5 cols, from the KV snapshot image",
                               ">=0.5x")
            with connect(uri) as conn:
                changed = _rows(0, CHANGED, 99)
                changed = changed.set_column(0, "id", pa.array(
                    np.random.default_rng(5).choice(ROWS, CHANGED, replace=False), pa.int64()))
                conn.table("pk").upsert(changed)
            tail = _scan_rows(uri, f"  the same after {CHANGED:,} upserts since the snapshot (image + tail)",
                              ">=0.5x")
            cost = _snapshot_cost(root / "data", uri, root)
        finally:
            _stop_server(process)
        return [image, tail, rocksdb, cost]
    finally:
        shutil.rmtree(root, ignore_errors=True)
