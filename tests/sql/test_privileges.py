"""The permissions each plan needs (pure: SQL -> plan -> permissions)."""

from __future__ import annotations

import pytest

from flightstore.errors import FlightstoreError
from flightstore.sql.nodes import Describe, ShowPartitions
from flightstore.sql.plan import plan
from flightstore.sql.privileges import plan_resources, required_permissions
from flightstore.sql.resolve import VisibleCatalog
from tests.sql.catalog import sample_catalog

CASES = [
    ("SELECT * FROM orders WHERE order_id = 1", ["READ on table shop.orders"]),
    ("SELECT * FROM orders WHERE order_id < 10", ["READ on table shop.orders"]),  # a range scan
    ("EXPLAIN SELECT * FROM items WHERE order_id = 1 AND item_id > 2", ["DESCRIBE on table shop.items"]),
    ("SELECT COUNT(*) FROM events", ["READ on table shop.events"]),
    ("SELECT * FROM `orders$changelog`", ["READ on table shop.orders"]),
    ("SELECT o.amount FROM orders o JOIN users u ON o.user_id = u.user_id WHERE u.vip",
     ["READ on table shop.orders", "READ on table shop.users"]),
    ("SELECT * FROM orders WHERE user_id IN (SELECT user_id FROM users)",
     ["READ on table shop.orders", "READ on table shop.users"]),
    ("WITH v AS (SELECT * FROM users) SELECT COUNT(*) FROM v JOIN analytics.Metrics m ON v.name = m.Name",
     ["READ on table analytics.Metrics", "READ on table shop.users"]),
    ("SELECT 1", []),
    ("INSERT INTO events VALUES (1, 'k', 'p', NULL)", ["WRITE on table shop.events"]),
    ("INSERT INTO events SELECT user_id, name, region, NULL FROM users",
     ["WRITE on table shop.events", "READ on table shop.users"]),
    ("DELETE FROM orders WHERE order_id = 3", ["WRITE on table shop.orders", "READ on table shop.orders"]),
    ("DELETE FROM orders", ["WRITE on table shop.orders"]),
    ("UPDATE orders SET status = 'x' WHERE amount > 1", ["WRITE on table shop.orders", "READ on table shop.orders"]),
    ("CREATE DATABASE sales", ["CREATE on cluster"]),
    ("DROP DATABASE empty", ["DROP on database empty"]),
    ("CREATE TABLE analytics.t (a INT)", ["CREATE on database analytics"]),
    ("DROP TABLE orders", ["DROP on table shop.orders"]),
    ("DESCRIBE users", ["DESCRIBE on table shop.users"]),
    ("USE analytics", []),  # nothing but seeing the database (plan_resources)
    ("EXPLAIN INSERT INTO events SELECT user_id, name, region, NULL FROM users",
     ["DESCRIBE on table shop.events", "DESCRIBE on table shop.users"]),
    ("GRANT READ ON DATABASE shop TO bob", ["ALL on database shop"]),
    ("REVOKE WRITE ON orders FROM bob", ["ALL on table shop.orders"]),
    ("SHOW TABLES", []),
    ("SHOW GRANTS", []),
    ("ALTER TABLE orders ADD COLUMN note STRING", ["ALTER on table shop.orders"]),
    ("ALTER TABLE daily DROP PARTITION (dt = '2024-01-01')", ["ALTER on table shop.daily"]),
    ("SHOW PARTITIONS daily", ["DESCRIBE on table shop.daily"]),
    ("SELECT * FROM `daily$partitions`", ["READ on table shop.daily"]),
    ("SELECT * FROM clicks", ["READ on table shop.clicks"]),  # a union read
    ("SELECT * FROM `clicks$lake` FOR SYSTEM_TIME AS OF 1", ["READ on table shop.clicks"]),
    ("SELECT * FROM `clicks$lake$snapshots`", ["READ on table shop.clicks"]),
    ("SELECT * FROM `clicks$lake$status`", ["READ on table shop.clicks"]),
]


@pytest.mark.parametrize("sql, expected", CASES, ids=[c[0] for c in CASES])
def test_required_permissions(sql, expected):
    assert [str(p) for p in required_permissions(plan(sql, sample_catalog()))] == expected


def test_every_query_route_that_reads_a_table_needs_read_on_it():
    """Each golden plan that reads a table (whatever its node) asks for READ on it: a new route
    the permission check does not know would otherwise read without a grant."""
    from flightstore.sql.execute import is_query
    from tests.sql.test_plan import CASES as GOLDEN

    checked = 0
    for _, sql, expected in GOLDEN:
        if expected.startswith("ERROR"):
            continue
        planned = plan(sql, sample_catalog())
        if is_query(planned) and hasattr(planned, "table") \
                and not isinstance(planned, (Describe, ShowPartitions)):  # metadata: DESCRIBE
            assert f"READ on table {planned.table}" in map(str, required_permissions(planned)), sql
            checked += 1
    assert checked >= 40


RESOURCES = [
    ("USE analytics", ["database analytics"]),
    ("SHOW TABLES IN analytics", ["database analytics"]),
    ("SHOW GRANTS ON TABLE orders", ["table shop.orders"]),
    ("SHOW GRANTS", []),
    ("SELECT * FROM orders o JOIN users u ON o.user_id = u.user_id", ["table shop.orders", "table shop.users"]),
    ("CREATE TABLE analytics.t (a INT)", ["database analytics"]),
    ("CREATE DATABASE sales", ["cluster"]),
]


@pytest.mark.parametrize("sql, expected", RESOURCES, ids=[c[0] for c in RESOURCES])
def test_plan_resources_name_every_object_a_plan_names(sql, expected):
    assert [str(r) for r in plan_resources(plan(sql, sample_catalog()))] == expected


def _error(sql: str, catalog, rename: tuple[str, str] = ("", "")) -> tuple[str, str]:
    """The planning error of ``sql`` (its type and message, ``rename[0]`` written ``rename[1]``)."""
    try:
        plan(sql, catalog)
    except FlightstoreError as exc:
        return type(exc).__name__, str(exc).replace(*rename) if rename[0] else str(exc)
    raise AssertionError(f"{sql} planned")


@pytest.mark.parametrize("sql", [
    "SELECT nosuchcol FROM {t}",                           # would list the columns
    "SELECT * FROM {t} WHERE status = DATE '2020-01-01'",  # would name a type
    "INSERT INTO {t} VALUES (1)",                          # would list the INSERT columns
    "SELECT * FROM `{t}$lake`",                            # would tell an option
    "SELECT * FROM `{t}$partitions`",
    "DESCRIBE {t}",
    "SHOW PARTITIONS {t}",
    "GRANT READ ON TABLE {t} TO bob",
    "ALTER TABLE {t} ADD COLUMN x STRING",
])
def test_a_hidden_table_plans_exactly_like_an_absent_one(sql):
    """In a caller's VisibleCatalog, naming a table it may not see fails word for word as naming
    one that does not exist, whatever else the statement would have revealed."""
    hidden = VisibleCatalog(sample_catalog(), lambda database: True, lambda path: path.table != "orders")
    assert _error(sql.format(t="orders"), hidden) == \
        _error(sql.format(t="nosuch"), sample_catalog(), ("nosuch", "orders"))


def test_a_hidden_database_is_absent():
    hidden = VisibleCatalog(sample_catalog(), lambda database: database != "analytics", lambda path: True)
    for sql in ("USE analytics", "SHOW TABLES IN analytics", "SELECT * FROM analytics.Metrics",
                "CREATE TABLE analytics.t (a INT)"):
        assert _error(sql, hidden) == _error(sql.replace("analytics", "nodb"), sample_catalog(), ("nodb", "analytics"))
