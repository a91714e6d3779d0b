"""The executor's plan cache and point-lookup templates return the same plans as the planner."""

from __future__ import annotations

import pyarrow as pa

from flightstore.sql import nodes
from flightstore.sql.execute import Executor
from flightstore.sql.plan import plan as plan_sql
from flightstore.sql.execute import StoreCatalog


def test_cached_and_templated_plans_equal_fresh_plans(store):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.float64())])
    store.create_table("t", schema, primary_key=["a", "b"])
    executor = Executor(store)
    sql = "SELECT v, a FROM t WHERE a = ? AND b = ?"
    first = executor.plan(sql, [1, "x"])
    assert isinstance(first, nodes.PointLookup)
    for params in ([2, "y"], [3, "z\x00"], [1, "x"]):
        got = executor.plan(sql, params)
        fresh = plan_sql(sql, StoreCatalog(store), params)
        assert got.explain() == fresh.explain()
    # A value of the wrong kind still goes through the planner and its error.
    import pytest
    from flightstore.errors import SqlError
    with pytest.raises(SqlError):
        executor.plan(sql, ["not-a-number", "y"])
    # DDL changes the catalog version: cached plans of the old table are not reused.
    store.drop_table("t")
    store.create_table("t", pa.schema([("a", pa.int64()), ("b", pa.string())]), primary_key=["a", "b"])
    assert executor.plan(sql.replace("v, a", "a"), [5, "q"]).columns == ("a",)
    import flightstore.errors as errors
    with pytest.raises(errors.SqlError):
        executor.plan(sql, [1, "x"])  # column v is gone
