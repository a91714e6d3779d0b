"""The ``flightstore://`` SQLAlchemy dialect (SQLAlchemy 2 here; Superset runs it on 1.4) against a
real server: Core DDL and DML, DATE / TIMESTAMP / DECIMAL binds and literals, schema-qualified
Core queries, reflection with primary keys, the URL's database as current schema, pandas through
an engine."""

from __future__ import annotations

import datetime as dt
import decimal
from importlib import import_module
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa
import tomllib
from sqlalchemy.dialects import registry

registry.register("flightstore", "flightstore_sqlalchemy.dialect", "FlightstoreDialect")
ROOT = Path(__file__).resolve().parents[2]


def _url(server, database: str = "") -> str:
    return f"flightstore://127.0.0.1:{server.uri.rsplit(':', 1)[1]}/{database}"


@pytest.fixture
def engine(server):
    engine = sa.create_engine(_url(server))
    yield engine
    engine.dispose()


def _sales(metadata: sa.MetaData) -> sa.Table:
    return sa.Table("sales", metadata,
                    sa.Column("id", sa.BigInteger, primary_key=True),
                    sa.Column("cust_id", sa.BigInteger),
                    sa.Column("amount", sa.Numeric(10, 2)),
                    sa.Column("day", sa.Date),
                    sa.Column("at", sa.DateTime),
                    sa.Column("note", sa.String),
                    schema="bi")


ROWS = [
    {"id": 1, "cust_id": 10, "amount": decimal.Decimal("1.50"), "day": dt.date(2026, 1, 5),
     "at": dt.datetime(2026, 1, 5, 9, 30), "note": "a"},
    {"id": 2, "cust_id": 10, "amount": decimal.Decimal("2.25"), "day": dt.date(2026, 2, 1),
     "at": dt.datetime(2026, 2, 1, 12, 0, 0, 123456), "note": None},
    {"id": 3, "cust_id": 20, "amount": decimal.Decimal("4.00"), "day": dt.date(2026, 2, 9),
     "at": dt.datetime(2026, 2, 9, 23, 59, 59), "note": "c"},
]


def test_core_ddl_binds_and_schema_qualified_queries(server, engine) -> None:
    metadata = sa.MetaData()
    sales = _sales(metadata)
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE bi")
        metadata.create_all(conn)
        conn.execute(sales.insert(), ROWS)
        descriptor = server.store.table("bi.sales").descriptor
        assert list(descriptor.primary_key) == ["id"]
        assert str(descriptor.schema.field("amount").type) == "decimal128(10, 2)"

        back = conn.execute(sa.select(sales).order_by(sales.c.id)).mappings().all()
        assert [dict(r) for r in back] == ROWS
        # DATE, TIMESTAMP and DECIMAL bound as parameters
        picked = conn.execute(sa.select(sales.c.id).where(
            sales.c.day >= dt.date(2026, 2, 1), sales.c.at < dt.datetime(2026, 2, 9, 23, 59, 59),
            sales.c.amount > decimal.Decimal("2.00"))).scalars().all()
        assert picked == [2]
        # schema-qualified columns through the residual engine (GROUP BY bi.sales.cust_id)
        query = (sa.select(sales.c.cust_id, sa.func.sum(sales.c.amount).label("total"))
                 .group_by(sales.c.cust_id).order_by(sales.c.cust_id))
        assert "bi.sales.cust_id" in str(query.compile(engine))
        assert conn.execute(query).all() == [(10, decimal.Decimal("3.75")), (20, decimal.Decimal("4.00"))]
        # the same with every value rendered as a literal, as BI tools compile
        literal = sa.select(sales.c.id).where(sales.c.day == dt.date(2026, 1, 5),
                                              sales.c.at > dt.datetime(2026, 1, 1))
        text = str(literal.compile(engine, compile_kwargs={"literal_binds": True}))
        assert "DATE '2026-01-05'" in text and "TIMESTAMP '2026-01-01 00:00:00'" in text
        assert conn.exec_driver_sql(text).scalars().all() == [1]
        conn.execute(sales.update().where(sales.c.id == 3).values(note="z"))
        conn.execute(sales.delete().where(sales.c.id == 1))
        assert conn.execute(sa.select(sales.c.id, sales.c.note).order_by(sales.c.id)).all() == [
            (2, None), (3, "z")]


def test_reflection_types_and_primary_keys(server, engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE bi")
        _sales(sa.MetaData()).create(conn)
        conn.exec_driver_sql("CREATE TABLE events (id BIGINT, seq INT, PRIMARY KEY (id, seq) NOT ENFORCED)")
    inspector = sa.inspect(engine)
    assert inspector.default_schema_name == "default"
    assert sorted(inspector.get_schema_names()) == ["bi", "default"]
    assert inspector.get_table_names("bi") == ["sales"]
    assert inspector.get_table_names() == ["events"]
    assert inspector.has_table("sales", schema="bi") and not inspector.has_table("nope", schema="bi")
    assert not inspector.has_table("sales", schema="no_such_db")
    columns = {c["name"]: c for c in inspector.get_columns("sales", schema="bi")}
    kinds = {name: type(c["type"]) for name, c in columns.items()}
    assert kinds == {"id": sa.BIGINT, "cust_id": sa.BIGINT, "amount": sa.DECIMAL, "day": sa.DATE,
                     "at": sa.TIMESTAMP, "note": sa.TEXT}
    assert (columns["amount"]["type"].precision, columns["amount"]["type"].scale) == (10, 2)
    assert columns["id"]["nullable"] is False and columns["note"]["nullable"] is True
    assert inspector.get_pk_constraint("sales", schema="bi")["constrained_columns"] == ["id"]
    assert inspector.get_pk_constraint("events")["constrained_columns"] == ["id", "seq"]
    reflected = sa.Table("sales", sa.MetaData(), autoload_with=engine, schema="bi")
    assert [c.name for c in reflected.primary_key] == ["id"]
    with pytest.raises(sa.exc.NoSuchTableError):
        sa.Table("nope", sa.MetaData(), autoload_with=engine, schema="bi")


def test_url_database_is_the_current_schema(server, engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE bi")
        conn.exec_driver_sql("CREATE TABLE bi.t (id BIGINT)")
        conn.exec_driver_sql("INSERT INTO bi.t VALUES (7)")
    bi = sa.create_engine(_url(server, "bi"))
    try:
        assert sa.inspect(bi).default_schema_name == "bi"
        with bi.connect() as conn:
            assert conn.exec_driver_sql("SELECT id FROM t").scalars().all() == [7]
    finally:
        bi.dispose()


def test_pandas_through_the_engine(server, engine) -> None:
    frame = pd.DataFrame({"id": [1, 2], "city": ["oslo", "lima"],
                          "at": pd.to_datetime(["2026-01-01", "2026-01-02"])})
    assert frame.to_sql("cities", engine, index=False) == 2
    back = pd.read_sql("SELECT * FROM cities ORDER BY id", engine)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)


def test_entry_points_name_importable_objects() -> None:
    """pyproject's entry points (what SQLAlchemy and Superset discover) name real objects."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["sqlalchemy.dialects"]["flightstore"]
    module, _, name = target.partition(":")
    assert getattr(import_module(module), name).name == "flightstore"
    spec = project["entry-points"]["superset.db_engine_specs"]["flightstore"]
    assert spec == "flightstore_sqlalchemy.superset:FlightstoreEngineSpec"
    assert (ROOT / "flightstore_sqlalchemy" / "superset.py").exists()
