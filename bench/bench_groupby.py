"""GROUP BY speed (issue 15): partial aggregates per bucket, merged, through the server.

Ours: a flightstore server in its own process, queried through ADBC (``fetch_arrow_table``).

* 5M rows in a log table (4 buckets) vs DuckDB in this process on the very Arrow table the server
  was loaded with (``duckdb.register``: no I/O, no transport) — goal >= 0.5x;
* the same query over 1M rows in a primary-key table vs over the same 1M rows in a log table,
  both through the server — goal >= 0.5x.

Each query is run at two group counts: 50 groups (a string key) and 100k groups (an integer key).
Answers are checked equal to DuckDB's before timing; the query plans are checked to push partial
aggregates (``EXPLAIN`` shows ``partial=``). Ratios are peer time / our time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from bench.adbc import adbc_queries
from bench.report import Row, best_interleaved
from flightstore.store import Store

__all__ = ["run"]

LOG_ROWS = 5_000_000
PK_ROWS = 1_000_000
BUCKETS = 4
ROUNDS = 5
APPEND_BATCH = 500_000
QUERIES = {
    "50 groups": "SELECT category, COUNT(*) AS n, SUM(amount) AS total, AVG(qty) AS mean_qty, "
                 "MAX(amount) AS top FROM {t} GROUP BY category ORDER BY category",
    "100k groups": "SELECT user_id, COUNT(*) AS n, SUM(amount) AS total, MIN(qty) AS low "
                   "FROM {t} GROUP BY user_id ORDER BY user_id",
}


def events(rows: int, seed: int = 11) -> pa.Table:
    rng = np.random.default_rng(seed)
    categories = np.array([f"cat-{i:02d}" for i in range(50)])
    return pa.table({
        "id": pa.array(np.arange(rows), pa.int64()),
        "user_id": pa.array(rng.integers(0, 100_000, rows), pa.int64()),
        "category": pa.array(categories[rng.integers(0, 50, rows)]),
        "amount": pa.array(np.round(rng.uniform(0, 500, rows), 2)),
        "qty": pa.array(rng.integers(1, 20, rows).astype(np.int32)),
    })


def _build(data_dir: Path, big: pa.Table, small: pa.Table) -> None:
    options = {"bucket.num": str(BUCKETS)}
    with Store(data_dir) as store:
        targets = [(store.create_table("log_big", big.schema, options=options).append, big),
                   (store.create_table("log_small", small.schema, options=options).append, small),
                   (store.create_table("pk_small", small.schema, primary_key=["id"],
                                       options=options).upsert, small)]
        for write, table in targets:
            for start in range(0, table.num_rows, APPEND_BATCH):
                write(table.slice(start, APPEND_BATCH))


def _same(got: pa.Table, expected: pa.Table) -> bool:
    if got.column_names != expected.column_names or got.num_rows != expected.num_rows:
        return False
    for ours, theirs in zip(got.columns, expected.columns):
        a, b = ours.to_numpy(zero_copy_only=False), theirs.to_numpy(zero_copy_only=False)
        if a.dtype.kind == "f":
            if not np.allclose(a.astype(float), b.astype(float), rtol=1e-9, atol=1e-9):
                return False
        elif not (a == b).all():
            return False
    return True


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-groupby-"))
    big, small = events(LOG_ROWS), events(PK_ROWS, seed=12)
    started = time.perf_counter()
    _build(root / "data", big, small)
    print(f"bench_groupby: tables built in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    local = duckdb.connect()
    local.register("big", big)
    local.register("small", small)
    rows: list[Row] = []
    with adbc_queries(root / "data") as ours:
        for label, template in QUERIES.items():
            for table in ("log_big", "pk_small"):
                plan = ours("EXPLAIN " + template.format(t=table))().column(0)[0].as_py()
                if "partial=" not in plan:
                    raise AssertionError(f"{label} on {table} does not push partial aggregates: {plan}")
            peer_sql = template.format(t="big")
            fns = {"ours": ours(template.format(t="log_big")),
                   "peer": lambda q=peer_sql: local.sql(q).to_arrow_table()}
            if not _same(fns["ours"](), fns["peer"]()):
                raise AssertionError(f"{label} over log_big differs from DuckDB")
            best = best_interleaved(fns, ROUNDS)
            rows.append(Row(f"GROUP BY {label}, 5M rows, log table (s)", best["ours"], best["peer"], "s",
                            "DuckDB on the same Arrow table, in process", higher_is_better=False,
                            goal=">=0.5x"))
            fns = {"ours": ours(template.format(t="pk_small")), "peer": ours(template.format(t="log_small"))}
            expected = local.sql(template.format(t="small")).to_arrow_table()
            if not (_same(fns["ours"](), expected) and _same(fns["peer"](), expected)):
                raise AssertionError(f"{label} over the 1M-row tables differs from DuckDB")
            best = best_interleaved(fns, ROUNDS)
            rows.append(Row(f"GROUP BY {label}, 1M rows, primary-key table (s)", best["ours"], best["peer"],
                            "s", "the same rows in a log table, same server", higher_is_better=False,
                            goal=">=0.5x"))
    return rows
