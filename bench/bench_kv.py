"""Primary-key tables at scale over Flight SQL, each figure against a peer measured in the same run.

One ``flightstore serve`` process holds a 1M-row x 5-column primary-key table (4 buckets) and a log
table of the same rows, appended in key order (so the log's per-batch statistics skip everything
but the first batches: the log table at its best). Peers are measured side by side, in interleaved
rounds (``bench.report.best_interleaved``).

1. ``SELECT * FROM t WHERE id < 1000`` on the primary-key table (a RocksDB seek range per bucket)
   vs the same query on the log table (goal >= 0.5x).
2. The same range with ``LIMIT 10`` (stops after the first rows) vs the log table's.
3. ``SELECT * FROM t`` of the whole primary-key table (the chunked RocksDB scan every PK read takes
   when no KV snapshot file serves it) vs the log table's full scan (issue 12's goal >= 0.5x).
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
from bench.report import Row, best_interleaved
from flightstore.store import Store

ROWS = 1_000_000
BUCKETS = 4
WRITE_BATCH = 100_000
RANGE_QUERIES = 20  # queries per round of the range rows
ROUNDS = 5


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "user": pa.array(rng.integers(0, 10_000, n), pa.int64()),
        "amount": pa.array(rng.random(n)),
        "status": pa.array(np.array(["new", "paid", "shipped", "done"])[rng.integers(0, 4, n)]),
        "ts": pa.array(rng.integers(0, 2**40, n), pa.int64()).cast(pa.timestamp("ms")),
    })


def _build(data_dir: Path, rows: pa.Table) -> None:
    with Store(data_dir) as store:
        options = {"bucket.num": str(BUCKETS)}
        pk = store.create_table("pk", rows.schema, primary_key=["id"], options=options)
        log = store.create_table("lg", rows.schema, options=options)
        for start in range(0, rows.num_rows, WRITE_BATCH):
            batch = rows.slice(start, WRITE_BATCH)
            pk.upsert(batch)
            log.append(batch)


def _repeat(client: flight.FlightClient, sql: str, times: int, expected: int):
    def run() -> None:
        for _ in range(times):
            if _sql_read(client, sql) != expected:
                raise AssertionError(f"{sql} did not return {expected} rows")
    return run


def bench_ranges(uri: str) -> list[Row]:
    client = flight.FlightClient(uri)
    runs = {
        "pk range": _repeat(client, "SELECT * FROM pk WHERE id < 1000", RANGE_QUERIES, 1000),
        "log range": _repeat(client, "SELECT * FROM lg WHERE id < 1000", RANGE_QUERIES, 1000),
        "pk limit": _repeat(client, "SELECT * FROM pk WHERE id < 1000 LIMIT 10", RANGE_QUERIES, 10),
        "log limit": _repeat(client, "SELECT * FROM lg WHERE id < 1000 LIMIT 10", RANGE_QUERIES, 10),
    }
    for run in runs.values():
        run()  # warm both tables' files and plans
    best = best_interleaved(runs, ROUNDS)
    ms = {name: seconds / RANGE_QUERIES * 1e3 for name, seconds in best.items()}
    return [
        Row("SQL WHERE id < 1000, 1M-row PK table (RocksDB range)", ms["pk range"], ms["log range"],
            "ms/query", "the same query on a log table of the same rows", higher_is_better=False,
            goal=">=0.5x"),
        Row("SQL WHERE id < 1000 LIMIT 10, 1M-row PK table", ms["pk limit"], ms["log limit"],
            "ms/query", "the same query on the log table", higher_is_better=False),
    ]


def bench_full_scan(uri: str) -> list[Row]:
    client = flight.FlightClient(uri)
    runs = {"pk": _repeat(client, "SELECT * FROM pk", 1, ROWS),
            "log": _repeat(client, "SELECT * FROM lg", 1, ROWS)}
    best = best_interleaved(runs, 3)
    return [Row("SQL SELECT * 1M-row PK table (chunked RocksDB scan)", ROWS / best["pk"],
                ROWS / best["log"], "rows/s", "full scan of the log table of the same rows",
                goal=">=0.5x (issue 12)")]


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-kv-"))
    try:
        started = time.perf_counter()
        _build(root / "data", _rows(ROWS))
        print(f"bench_kv: tables built in {time.perf_counter() - started:.1f}s", file=sys.stderr,
              flush=True)
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--host", "127.0.0.1", "--port", "0"], "flightstore serving")
        try:
            return bench_ranges(uri) + bench_full_scan(uri)
        finally:
            _stop_server(process)
    finally:
        shutil.rmtree(root, ignore_errors=True)
