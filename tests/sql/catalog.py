"""An in-memory catalog view for planner tests: a dict of TableDescriptors."""

from __future__ import annotations

import pyarrow as pa

from flightstore.alter import AddPartition, apply_changes
from flightstore.errors import TableNotFound
from flightstore.schema import TableDescriptor, TablePath, sql_type_to_arrow

__all__ = ["DictCatalog", "sample_catalog"]


class DictCatalog:
    """Implements flightstore.sql.plan.CatalogView (plus the optional list_tables)."""

    def __init__(self, tables: list[TableDescriptor], databases: list[str],
                 default_database: str = "shop") -> None:
        self.default_database = default_database
        self.tables = {t.path: t for t in tables}
        self.databases = list(databases)

    def get_table(self, path: TablePath) -> TableDescriptor:
        try:
            return self.tables[path]
        except KeyError:
            raise TableNotFound(f"table {path} does not exist") from None

    def list_databases(self) -> list[str]:
        return list(self.databases)

    def list_tables(self, database: str) -> list[str]:
        return [p.table for p in self.tables if p.database == database]


def _schema(*columns: str) -> pa.Schema:
    fields = []
    for spec in columns:
        name, _, type_text = spec.partition(" ")
        nullable = not type_text.endswith(" NOT NULL")
        fields.append(pa.field(name, sql_type_to_arrow(type_text), nullable=nullable))
    return pa.schema(fields)


def sample_catalog() -> DictCatalog:
    """shop.orders (PK order_id), shop.items (PK order_id, item_id; bucket key order_id),
    shop.users (PK user_id), shop.events (log table), shop.daily (PK dt, order_id; partitioned by
    dt: 2024-01-01, 2024-01-02, 2024-01-03; 3 buckets), shop.visits (log table partitioned by day DATE and
    hour INT: four partitions), shop.clicks (datalake-enabled log table, 2 buckets), shop.ledger
    (datalake-enabled PK table) and analytics.Metrics (mixed-case names, log table)."""
    daily = TableDescriptor.create(
        "shop.daily", _schema("dt STRING", "order_id BIGINT", "total DOUBLE"),
        primary_key=["dt", "order_id"], partition_keys=["dt"], options={"bucket.num": "3"})
    daily = apply_changes(daily, [AddPartition((d,)) for d in ("2024-01-01", "2024-01-02", "2024-01-03")])
    visits = TableDescriptor.create(
        "shop.visits", _schema("day DATE", "hour INT", "url STRING", "ms BIGINT"),
        partition_keys=["day", "hour"], options={"bucket.num": "2"})
    visits = apply_changes(visits, [AddPartition(v) for v in (
        ("2024-01-01", "9"), ("2024-01-01", "10"), ("2024-01-02", "9"), ("2024-01-02", "23"))])
    tables = [
        TableDescriptor.create(
            "shop.orders", _schema("order_id BIGINT", "user_id BIGINT NOT NULL", "amount DOUBLE",
                                   "status STRING", "ts TIMESTAMP(3)"),
            primary_key=["order_id"], options={"bucket.num": "4"}),
        TableDescriptor.create(
            "shop.items", _schema("order_id BIGINT", "item_id INT", "name STRING", "qty INT",
                                  "price DECIMAL(10, 2)"),
            primary_key=["order_id", "item_id"], options={"bucket.key": "order_id", "bucket.num": "2"}),
        TableDescriptor.create(
            "shop.users", _schema("user_id BIGINT", "name STRING", "region STRING", "vip BOOLEAN",
                                  "born DATE"),
            primary_key=["user_id"]),
        TableDescriptor.create(
            "shop.events", _schema("user_id BIGINT", "kind STRING", "payload STRING",
                                   "ts TIMESTAMP_LTZ(3)")),
        daily,
        visits,
        TableDescriptor.create(
            "shop.clicks", _schema("user_id BIGINT", "url STRING", "ts TIMESTAMP(3)"),
            options={"bucket.num": "2", "bucket.key": "user_id", "table.datalake.enabled": "true"}),
        TableDescriptor.create(
            "shop.ledger", _schema("id BIGINT", "balance DOUBLE"), primary_key=["id"],
            options={"table.datalake.enabled": "true"}),
        TableDescriptor.create(
            "analytics.Metrics", _schema("Name STRING", "Value DOUBLE", "At TIMESTAMP(3)")),
    ]
    return DictCatalog(tables, ["shop", "analytics", "empty"])
