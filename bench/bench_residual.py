"""Residual SQL speed (issue 15, streaming execution), against DuckDB in the same run.

GROUP BY over a 5M-row log table through the executor (inputs streamed from the log into the
memory-limited embedded DuckDB, result streamed out) vs DuckDB running the same query on the same
rows already in one Arrow table in this process (goal >= 0.5x); and a primary-key lookup with a
20,000-value IN list (planned in linear time; it was quadratic: minutes) vs DuckDB filtering the
same Arrow table with the same SQL.
"""

from __future__ import annotations

import tempfile

import duckdb
import numpy as np
import pyarrow as pa

from bench.report import Row, best_interleaved
from flightstore.sql.execute import Executor
from flightstore.store import Store

__all__ = ["run"]

ROWS = 5_000_000
GROUPS = 100_000
IN_VALUES = 20_000
GROUP_BY = "SELECT g, sum(v) AS s, count(*) AS n FROM {t} GROUP BY g"


def _rows(start: int, count: int) -> pa.Table:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table({"id": ids, "g": ids * 7919 % GROUPS, "v": (ids % 1000).astype(np.float64)})


def run() -> list[Row]:
    with tempfile.TemporaryDirectory() as root, Store(root, fsync=False) as store:
        log = store.create_table("events", _rows(0, 1).schema, options={"bucket.num": "2"})
        for start in range(0, ROWS, 500_000):
            log.append(_rows(start, 500_000))
        keyed = store.create_table("keyed", _rows(0, 1).schema, primary_key=["id"],
                                   options={"bucket.num": "2"})
        keyed.upsert(_rows(0, 200_000))
        executor = Executor(store)
        arrow_events = log.scan_table()
        arrow_keyed = keyed.scan_table()
        duck = duckdb.connect()
        duck.register("events", arrow_events)
        duck.register("keyed", arrow_keyed)
        in_list = ", ".join(str(v) for v in range(0, 10 * IN_VALUES, 10))
        lookup = f"SELECT id, v FROM {{t}} WHERE id IN ({in_list})"

        def ours_group_by() -> None:
            assert executor.execute_table(executor.plan(GROUP_BY.format(t="events"))).num_rows == GROUPS

        def duck_group_by() -> None:
            assert duck.sql(GROUP_BY.format(t="events")).to_arrow_table().num_rows == GROUPS

        def ours_lookup() -> None:
            executor.plan_cache.clear()  # plan it every time, as a new statement text would be
            assert executor.execute_table(executor.plan(lookup.format(t="keyed"))).num_rows == IN_VALUES

        def duck_lookup() -> None:
            assert duck.sql(lookup.format(t="keyed")).to_arrow_table().num_rows == IN_VALUES

        times = best_interleaved({"ours": ours_group_by, "duck": duck_group_by}, rounds=3)
        lookups = best_interleaved({"ours": ours_lookup, "duck": duck_lookup}, rounds=2)
        executor.close()
    return [
        Row(f"GROUP BY over {ROWS / 1e6:g}M log rows ({GROUPS // 1000}k groups)", times["ours"], times["duck"],
            "s", "DuckDB, same Arrow table", higher_is_better=False, goal=">=0.5x"),
        Row(f"PK lookup, IN list of {IN_VALUES:,} values", lookups["ours"], lookups["duck"],
            "s", "DuckDB, same Arrow table", higher_is_better=False),
    ]
