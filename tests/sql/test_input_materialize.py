"""Residual-SQL inputs: small tables are handed to DuckDB whole (parallel scan, filter pushdown),
big ones streamed (bounded memory); both give the same answer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flightstore.sql.execute import Executor
from flightstore.store import Store

ORDERS = 5_000
LINES = 20_000
JOIN = ("SELECT o.o_cust, sum(l.l_price) AS revenue FROM orders o JOIN lineitem l "
        "ON l.l_order = o.o_key WHERE o.o_cust < 50 AND l.l_price > 10 "
        "GROUP BY o.o_cust ORDER BY o.o_cust")


def _load(store: Store) -> None:
    store.create_table("orders", pa.schema([("o_key", pa.int64()), ("o_cust", pa.int64())]),
                       primary_key=["o_key"], options={"bucket.num": "2"})
    store.create_table("lineitem", pa.schema([("l_order", pa.int64()), ("l_price", pa.float64()),
                                              ("l_note", pa.string())]), options={"bucket.num": "2"})
    keys = np.arange(ORDERS, dtype=np.int64)
    store.table("orders").upsert(pa.table({"o_key": keys, "o_cust": keys % 100}))
    lines = np.arange(LINES, dtype=np.int64)
    store.table("lineitem").append(pa.table({"l_order": lines % ORDERS, "l_price": (lines % 40).astype(float),
                                             "l_note": pa.array(["x"] * LINES)}))


def _expected() -> pa.Table:
    lines = np.arange(LINES, dtype=np.int64)
    cust, price = (lines % ORDERS) % 100, (lines % 40).astype(float)
    keep = (cust < 50) & (price > 10)
    sums = np.bincount(cust[keep], weights=price[keep], minlength=50)
    return pa.table({"o_cust": np.arange(50, dtype=np.int64), "revenue": sums})


def _run(store: Store) -> tuple[pa.Table, list[str]]:
    """The join's answer and the kind of each input DuckDB got (``table`` or ``stream``)."""
    executor = Executor(store)
    kinds: list[str] = []
    run = executor.engine.run

    def recording_run(sql, inputs, *args, **kwargs):
        kinds.extend("table" if isinstance(data, pa.Table) else "stream" for data in inputs.values())
        return run(sql, inputs, *args, **kwargs)

    executor.engine.run = recording_run
    try:
        return executor.execute_table(executor.plan(JOIN)), kinds
    finally:
        executor.engine.close()


# orders: 5k rows x 16 B = 80 kB; lineitem (only l_order, l_price are read): 20k rows x 16 B =
# 320 kB. The default limit holds both; 100kB holds orders only; 0 streams everything.
@pytest.mark.parametrize("options, kinds", [
    ({}, ["table", "table"]),
    ({"query.materialize-input-limit": "100kB"}, ["stream", "table"]),
    ({"query.materialize-input-limit": "0"}, ["stream", "stream"]),
])
def test_small_join_inputs_are_materialized_and_big_ones_streamed(tmp_path, options, kinds) -> None:
    with Store(tmp_path / "data", fsync=False, options=options) as store:
        _load(store)
        result, got = _run(store)
    assert result.cast(_expected().schema).equals(_expected())
    assert sorted(got) == kinds, got


def test_the_limit_is_capped_at_a_quarter_of_the_memory_limit(tmp_path) -> None:
    options = {"query.materialize-input-limit": "1GB", "query.memory-limit": "8MB"}
    with Store(tmp_path / "data", fsync=False, options=options) as store:
        executor = Executor(store)
        try:
            assert executor.materialize_limit == 2_000_000
        finally:
            executor.engine.close()
