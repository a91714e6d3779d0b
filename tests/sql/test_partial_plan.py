"""A partial aggregate travels between servers as a plan (flightstore/sql/partial_plan.py): the
planner's partial SQL round-trips through it, and a receiver derives the SQL itself from parts it
checked, so no sender can make it run anything but COUNT/SUM/MIN/MAX of row expressions over its
input (no settings, no files, no tables, no unknown functions)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flightstore.errors import InvalidInput
from flightstore.sql.partial_plan import PartialPlan

COLUMNS = ["k", "ts", "name", "x"]


@pytest.mark.parametrize("sql", [
    'SELECT k % 2 AS "__g0", COUNT(*) AS "__a0", SUM(x) AS "__a1" FROM "__t0" AS "t" GROUP BY k % 2',
    'SELECT COUNT(*) AS "__a0" FROM "__t0" AS "daily" WHERE name = \'a\' AND x > 1',
    'SELECT DATE_TRUNC(\'DAY\', ts) AS "__g0", LOWER(name) AS "__g1", MIN(x) AS "__a0", MAX(CASE WHEN x > 0 '
    'THEN x ELSE 0 END) AS "__a1" FROM "__t0" GROUP BY DATE_TRUNC(\'DAY\', ts), LOWER(name)',
])
def test_the_planners_partials_round_trip_and_run_alike(sql):
    plan = PartialPlan.from_sql(sql, "__t0")
    assert PartialPlan.from_json(plan.to_json()) == plan
    derived = plan.sql("__rows", COLUMNS)
    rows = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "ts": pa.array([0, 86_400_000_000, 1], pa.timestamp("us")),
                     "name": ["A", "b", "A"], "x": [1.5, -2.0, 3.0]})
    con = duckdb.connect()
    con.register("__t0", rows)
    con.register("__rows", rows)
    assert sorted(map(str, con.sql(derived).fetchall())) == sorted(map(str, con.sql(sql).fetchall()))


@pytest.mark.parametrize("part", [
    {"keys": ["current_setting('memory_limit')"]},
    {"keys": ["getenv('HOME')"]},
    {"where": "1 = 1; SET memory_limit = '500GB'"},
    {"where": "k IN (SELECT 1)"},
    {"keys": ["(SELECT COUNT(*) FROM duckdb_settings())"]},
    {"aggregates": [["SUM", "read_csv('/etc/passwd')"]]},
    {"aggregates": [["STRING_AGG", "name"]]},
    {"aggregates": [["SUM", "SUM(x)"]]},
    {"aggregates": [["SUM", None]]},
    {"keys": ["nosuch"]},
    {"keys": ["other.k"]},
    {"keys": ["random()"]},
])
def test_a_receiver_refuses_anything_but_the_partial_shape(part):
    body = {"keys": [], "aggregates": [["COUNT", None]], "where": None, "alias": "t", **part}
    with pytest.raises(InvalidInput):
        PartialPlan.from_json(body).sql("__rows", COLUMNS)


@pytest.mark.parametrize("body", [None, "SELECT 1", {"keys": "k", "aggregates": [["COUNT", None]]},
                                  {"keys": [], "aggregates": []}, {"keys": [], "aggregates": [["COUNT"]]}])
def test_a_malformed_plan_is_invalid_input(body):
    with pytest.raises(InvalidInput):
        PartialPlan.from_json(body)
