"""``WHERE id IN (<n values>)`` costs work linear in n (it was quadratic: sqlglot's ``replace``
re-parents the whole IN list for each literal turned into a placeholder and back), and a 20k-value
list answers correctly on a primary-key table (point lookup) and in residual SQL."""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pyarrow as pa

from flightstore.sql import nodes
from flightstore.sql.execute import Executor


def _keyed(store) -> Executor:
    store.create_table("k", pa.schema([("id", pa.int64()), ("v", pa.int64())]), primary_key=["id"],
                       options={"bucket.num": "2"})
    store.table("k").upsert(pa.table({"id": np.arange(50_000), "v": np.arange(50_000) * 3}))
    return Executor(store)


def _in_list(values) -> str:
    return ", ".join(str(v) for v in values)


def _calls_to_plan(executor: Executor, sql: str) -> int:
    """Python function calls (builtins included) the planner makes for ``sql``: a count of work
    that a busy machine does not change."""
    profile = cProfile.Profile()
    profile.runcall(executor.plan, sql)
    return pstats.Stats(profile).total_calls


def test_planning_an_in_list_is_linear_in_its_length(store) -> None:
    executor = _keyed(store)
    small, large = 500, 2_000
    calls = {n: _calls_to_plan(executor, f"SELECT * FROM k WHERE id IN ({_in_list(range(n))})")
             for n in (small, large)}
    # Linear: 4x the values, about 4x the calls (quadratic was 16x: 19M calls for 3,000 values).
    assert calls[large] < 5 * calls[small], calls
    residual = {n: _calls_to_plan(executor, f"SELECT v % 7, count(*) FROM k WHERE id IN "
                                            f"({_in_list(range(n))}) GROUP BY 1") for n in (small, large)}
    assert residual[large] < 5 * residual[small], residual


def test_a_20k_value_in_list_answers_correctly(store) -> None:
    executor = _keyed(store)
    wanted = np.arange(0, 60_000, 3)  # 20,000 values, a third of them beyond the table's keys
    sql = f"SELECT id, v FROM k WHERE id IN ({_in_list(wanted)})"
    plan = executor.plan(sql)
    assert isinstance(plan, nodes.PointLookup)
    found = executor.execute_table(plan).sort_by("id")
    expected = wanted[wanted < 50_000]
    assert found.column("id").to_pylist() == expected.tolist()
    assert found.column("v").to_pylist() == (expected * 3).tolist()
