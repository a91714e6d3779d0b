"""TPC-H-like Q1, Q3 and Q6 on 1M lineitem rows through the server vs DuckDB on the same Arrow data.

Ours: a flightstore server in its own process, queried through ADBC (``fetch_arrow_table``), over
log tables and again over primary-key tables of the same rows. Peer: DuckDB in this process on the
very Arrow tables the server was loaded with (``duckdb.register``), so the peer pays no I/O or
transport at all. Both answers are checked equal before timing. Ratios are peer time / our time
(goal >= 0.5x on log tables, >= 0.3x on primary-key tables).

Extra rows show a plain ``SELECT`` of the lineitem columns each query reads (an exact KV scan
sending 1M rows to the client). The queries themselves do not take that path: their inputs read
each bucket's KV snapshot image plus changelog, or the changelog alone before the first snapshot
(``KvTablet.full_scan`` with ``exact=False``), and aggregations run as partial aggregates.

The data is TPC-H's shape, generated with numpy (no dbgen here): 250k orders, 25k customers,
1M lineitems, value ranges as in the specification.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.adbc import adbc_queries
from bench.report import Row, best_interleaved
from flightstore.store import Store

LINEITEMS = 1_000_000
ORDERS = 250_000
CUSTOMERS = 25_000
BUCKETS = 2
ROUNDS = 5
APPEND_BATCH = 250_000

Q1 = """
SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty, SUM(l_extendedprice) AS sum_base_price,
       SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       AVG(l_quantity) AS avg_qty, AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc,
       COUNT(*) AS count_order
FROM {lineitem}
WHERE l_shipdate <= DATE '1998-09-02'
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus"""

Q3 = """
SELECT l_orderkey, SUM(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
FROM {customer} c JOIN {orders} o ON c.c_custkey = o.o_custkey
     JOIN {lineitem} l ON l.l_orderkey = o.o_orderkey
WHERE c.c_mktsegment = 'BUILDING' AND o.o_orderdate < DATE '1995-03-15'
  AND l.l_shipdate > DATE '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority
ORDER BY revenue DESC, o_orderdate, l_orderkey
LIMIT 10"""

Q6 = """
SELECT SUM(l_extendedprice * l_discount) AS revenue
FROM {lineitem}
WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24"""

QUERIES = {"Q1": Q1, "Q3": Q3, "Q6": Q6}
# The columns each query reads from lineitem (the PK-scan rows scan just these).
LINEITEM_COLUMNS = {
    "Q1": "l_returnflag, l_linestatus, l_quantity, l_extendedprice, l_discount, l_tax, l_shipdate",
    "Q3": "l_orderkey, l_extendedprice, l_discount, l_shipdate",
    "Q6": "l_extendedprice, l_discount, l_quantity, l_shipdate",
}


def _dates(rng: np.random.Generator, n: int, start: str, days: int) -> pa.Array:
    base = np.datetime64(start, "D")
    return pa.array(base + rng.integers(0, days, n).astype("timedelta64[D]"))


def tables(seed: int = 7) -> dict[str, pa.Table]:
    """customer, orders, lineitem with TPC-H's columns used by Q1/Q3/Q6 and its value ranges."""
    rng = np.random.default_rng(seed)
    segments = np.array(["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"])
    customer = pa.table({
        "c_custkey": pa.array(np.arange(1, CUSTOMERS + 1), pa.int64()),
        "c_mktsegment": pa.array(segments[rng.integers(0, 5, CUSTOMERS)]),
    })
    orderdate = _dates(rng, ORDERS, "1992-01-01", 2405)
    orders = pa.table({
        "o_orderkey": pa.array(np.arange(1, ORDERS + 1), pa.int64()),
        "o_custkey": pa.array(rng.integers(1, CUSTOMERS + 1, ORDERS), pa.int64()),
        "o_orderdate": orderdate,
        "o_shippriority": pa.array(np.zeros(ORDERS, np.int32)),
    })
    # 4 lineitems per order on average: order keys repeat, line numbers count within an order
    order_of = np.sort(rng.integers(0, ORDERS, LINEITEMS))
    starts = np.searchsorted(order_of, order_of, side="left")
    linenumber = (np.arange(LINEITEMS) - starts + 1).astype(np.int32)
    ship = (orderdate.to_numpy(zero_copy_only=False)[order_of]
            + rng.integers(1, 122, LINEITEMS).astype("timedelta64[D]"))
    quantity = rng.integers(1, 51, LINEITEMS).astype(np.float64)
    price = np.round(quantity * rng.uniform(900, 2000, LINEITEMS), 2)
    cutoff = np.datetime64("1995-06-17")
    flags = np.where(ship <= cutoff, np.array(["R", "A"])[rng.integers(0, 2, LINEITEMS)], "N")
    lineitem = pa.table({
        "l_orderkey": pa.array(order_of + 1, pa.int64()),
        "l_linenumber": pa.array(linenumber),
        "l_quantity": pa.array(quantity),
        "l_extendedprice": pa.array(price),
        "l_discount": pa.array(np.round(rng.integers(0, 11, LINEITEMS) / 100, 2)),
        "l_tax": pa.array(np.round(rng.integers(0, 9, LINEITEMS) / 100, 2)),
        "l_returnflag": pa.array(flags),
        "l_linestatus": pa.array(np.where(ship > cutoff, "O", "F")),
        "l_shipdate": pa.array(ship),
    })
    return {"customer": customer, "orders": orders, "lineitem": lineitem}


PRIMARY_KEYS = {"customer": ["c_custkey"], "orders": ["o_orderkey"],
                "lineitem": ["l_orderkey", "l_linenumber"]}


def _build(data_dir: Path, data: dict[str, pa.Table]) -> None:
    with Store(data_dir) as store:
        for name, table in data.items():
            options = {"bucket.num": str(BUCKETS)}
            log = store.create_table(f"log_{name}", table.schema, options=options)
            pk = store.create_table(f"pk_{name}", table.schema, primary_key=PRIMARY_KEYS[name],
                                    options=options)
            for start in range(0, table.num_rows, APPEND_BATCH):
                piece = table.slice(start, APPEND_BATCH)
                log.append(piece)
                pk.upsert(piece)


def _same(got: pa.Table, expected: pa.Table) -> bool:
    """Equal rows, floats within 1e-9 relative (sums in another order differ in the last bits)."""
    if got.column_names != expected.column_names or got.num_rows != expected.num_rows:
        return False
    for ours, theirs in zip(got.columns, expected.columns):
        for a, b in zip(ours.to_pylist(), theirs.to_pylist()):
            if isinstance(a, float) and isinstance(b, float):
                if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif a != b:
                return False
    return True


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-tpch-"))
    data = tables()
    started = time.perf_counter()
    _build(root / "data", data)
    print(f"bench_tpch: tables built in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    local = duckdb.connect()
    for name, table in data.items():
        local.register(name, table)
    rows: list[Row] = []
    with adbc_queries(root / "data") as ours:
        for kind, goal in (("log", ">=0.5x"), ("pk", ">=0.3x")):
            names = {n: f"{kind}_{n}" for n in data}
            for label, template in QUERIES.items():
                local_sql = template.format(**{n: n for n in data})
                fns = {"ours": ours(template.format(**names)),
                       "peer": lambda q=local_sql: local.sql(q).to_arrow_table()}
                got, expected = fns["ours"](), fns["peer"]()
                if not _same(got, expected):
                    raise AssertionError(f"{label} on {kind} tables differs from DuckDB:\n{got}\n{expected}")
                if kind == "pk":
                    columns = LINEITEM_COLUMNS[label]
                    fns["scan"] = ours(f"SELECT {columns} FROM pk_lineitem")
                    assert fns["scan"]().num_rows == LINEITEMS
                best = best_interleaved(fns, ROUNDS)
                table_kind = "log" if kind == "log" else "primary-key"
                rows.append(Row(f"TPC-H {label}, 1M lineitem, {table_kind} tables (s)", best["ours"],
                                best["peer"], "s", "DuckDB on the same Arrow tables, in process",
                                higher_is_better=False, goal=goal))
                if kind == "pk":
                    rows.append(Row(f"  {label}: plain SELECT of its lineitem columns, 1M rows (s)",
                                    best["scan"], best["peer"], "s",
                                    "the whole query in DuckDB (not the query's path: see docstring)",
                                    higher_is_better=False))
    checks = pc.sum(data["lineitem"]["l_quantity"]).as_py()
    print(f"bench_tpch: lineitem quantity checksum {checks:.0f}", file=sys.stderr, flush=True)
    return rows
