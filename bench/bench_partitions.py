"""Partitioned tables and schema evolution (issue 13), each figure measured against a peer in the
same run, over a real server (its own process) and Flight SQL:

1. ``SELECT * ... WHERE dt = <one day>`` on a table of 30 day partitions vs the same query on a table
   holding only that day's rows (not partitioned), for a log table and for a primary-key table: the
   partition pruning must make the 29 other days cost nearly nothing (goal >= 0.8x). As the issue
   defines it, the peer is flightstore itself. A third row, ``COUNT(*) WHERE dt = <day>``, is the
   maintained count of one partition vs the one-day table's count.
2. ``ALTER TABLE ... ADD COLUMN`` on a primary-key table of 1M rows (data in its log and KV) vs the
   same statement on an empty table of the same schema (goal <= 2x: nothing is rewritten), timed as
   the client sees it, in interleaved rounds (each round adds one column to each table). Both
   tables are open in the server, so both ALTERs make their open logs and KVs follow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import flight

from bench.bench_server import _sql_read, _start_server, _stop_server
from bench.report import Row, best_interleaved
from flightstore.client import connect
from flightstore.store import Store

DAYS = 30
ROWS_PER_DAY = 50_000
BUCKETS = 4
ALTER_ROWS = 1_000_000
ALTER_ROUNDS = 15
ROUNDS = 9
DAY = "2026-11-15"  # one of the 30 days


def _day_rows(day: str, start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    return pa.table({
        "dt": pa.array([day] * n, pa.string()),
        "id": pa.array(np.arange(start, start + n), pa.int64()),
        "user_id": pa.array(rng.integers(0, 100_000, n), pa.int64()),
        "amount": pa.array(rng.random(n) * 100),
        "status": pa.array(np.array(["new", "paid", "shipped", "done"])[rng.integers(0, 4, n)]),
    })


def _days() -> list[str]:
    return [f"2026-11-{d:02d}" for d in range(1, DAYS + 1)]


def _build(data_dir: Path) -> None:
    schema = _day_rows(DAY, 0, 1).schema
    with Store(data_dir) as store:
        options = {"bucket.num": BUCKETS}
        log30 = store.create_table("log30", schema, partition_keys=["dt"], options={**options, "bucket.key": "id"})
        log1 = store.create_table("log1", schema, options={**options, "bucket.key": "id"})
        pk30 = store.create_table("pk30", schema, primary_key=["dt", "id"], partition_keys=["dt"], options=options)
        pk1 = store.create_table("pk1", schema, primary_key=["dt", "id"], options=options)
        for index, day in enumerate(_days()):
            rows = _day_rows(day, index * ROWS_PER_DAY, ROWS_PER_DAY)
            log30.append(rows)
            pk30.upsert(rows)
            if day == DAY:
                log1.append(rows)
                pk1.upsert(rows)
        big = store.create_table("big", schema, primary_key=["id"], options=options)
        store.create_table("empty", schema, primary_key=["id"], options=options)
        for start in range(0, ALTER_ROWS, 100_000):
            big.upsert(_day_rows(DAY, start, 100_000))


def _pruned_rows(uri: str) -> list[Row]:
    client = flight.FlightClient(uri)
    rows = []
    query = f"SELECT * FROM {{}} WHERE dt = '{DAY}'"
    for kind in ("log", "pk"):
        reads = {"30": lambda k=kind: _sql_read(client, query.format(f"{k}30")),
                 "1": lambda k=kind: _sql_read(client, query.format(f"{k}1"))}
        for name, read in reads.items():
            got = read()
            assert got == ROWS_PER_DAY, f"{kind}{name}: {got} rows"
        best = best_interleaved(reads, ROUNDS)
        rows.append(Row(f"{kind} table: WHERE dt = <day>, 30 partitions of {ROWS_PER_DAY // 1000}k rows",
                        ROWS_PER_DAY / best["30"], ROWS_PER_DAY / best["1"], "rows/s",
                        "the same query on a table holding only that day", goal=">= 0.8x"))
    counts = {"30": lambda: _sql_read(client, f"SELECT COUNT(*) FROM pk30 WHERE dt = '{DAY}'"),
              "1": lambda: _sql_read(client, "SELECT COUNT(*) FROM pk1")}
    best = best_interleaved(counts, ROUNDS * 5)
    rows.append(Row("pk table: COUNT(*) WHERE dt = <day> (maintained count of one partition)",
                    best["30"] * 1000, best["1"] * 1000, "ms", "COUNT(*) of the one-day table",
                    higher_is_better=False, goal=">= 0.8x"))
    client.close()
    return rows


def _add_column_rows(uri: str) -> list[Row]:
    with connect(uri) as conn:
        assert conn.sql("SELECT COUNT(*) AS n FROM big").column(0)[0].as_py() == ALTER_ROWS
        assert conn.sql("SELECT COUNT(*) AS n FROM empty").column(0)[0].as_py() == 0  # both open
        # The 1M rows' files were just written: flush them, or the first fsyncs of the big table's
        # ALTERs (the schema epoch each bucket's log records) would wait for that writeback.
        os.sync()
        column = iter(range(10_000))
        statements = {"big": lambda: conn.sql(f"ALTER TABLE big ADD COLUMN c{next(column)} STRING"),
                      "empty": lambda: conn.sql(f"ALTER TABLE empty ADD COLUMN c{next(column)} STRING")}
        best = best_interleaved(statements, ALTER_ROUNDS)
        # every added column reads NULL for the 1M old rows, without a rewrite
        sample = conn.sql("SELECT * FROM big WHERE id = 123456")
        assert sample.num_rows == 1 and sample.num_columns == 5 + ALTER_ROUNDS
    return [Row(f"ALTER TABLE ADD COLUMN, primary-key table of {ALTER_ROWS // 1_000_000}M rows",
                best["big"] * 1000, best["empty"] * 1000, "ms", "the same ALTER on an empty table",
                higher_is_better=False, goal=">= 0.5x")]


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="flightstore-bench-parts-"))
    try:
        started = time.perf_counter()
        _build(root / "data")
        print(f"  built the tables in {time.perf_counter() - started:.0f} s", flush=True)
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--host", "127.0.0.1", "--port", "0"], "flightstore serving")
        try:
            return _pruned_rows(uri) + _add_column_rows(uri)
        finally:
            _stop_server(process)
    finally:
        shutil.rmtree(root, ignore_errors=True)
