"""Multi-row parameterised INSERTs (ADBC ``executemany``, SQLAlchemy inserts of a list of dicts)
store every parameter in the column the statement's column list names, whatever its order, on
primary-key and log tables, with whole and partial column lists (issue 20 item 1)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import sqlalchemy as sa
from adbc_driver_flightsql import dbapi
from sqlalchemy.dialects import registry

registry.register("flightstore", "flightstore_sqlalchemy.dialect", "FlightstoreDialect")

COLUMNS = {"id": "BIGINT", "s": "STRING", "n": "BIGINT", "a": "STRING", "b": "STRING"}


@pytest.fixture
def conn(server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot disable autocommit" when transactions are absent
        connection = dbapi.connect(server.uri, autocommit=True)
    yield connection
    connection.close()


def _run(conn, sql: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def _create(conn, name: str, primary_key: bool) -> None:
    columns = ", ".join(f"{c} {t}" for c, t in COLUMNS.items())
    key = ", PRIMARY KEY (id) NOT ENFORCED" if primary_key else ""
    options = "'bucket.num' = '2'" + ("" if primary_key else ", 'bucket.key' = 'id'")
    _run(conn, f"CREATE TABLE {name} ({columns}{key}) WITH ({options})")


def _value(column: str, row: int):
    return row * 10 + len(column) if COLUMNS[column] == "BIGINT" else f"{column}{row}"


@pytest.mark.parametrize("primary_key", [True, False], ids=["pk", "log"])
def test_executemany_with_permuted_and_partial_column_lists(conn, primary_key) -> None:
    names = list(COLUMNS)
    lists = [list(p) for p in itertools.permutations(names[1:4])][1:]  # every order but the table's
    lists += [["n", "id", "b"], ["b", "id"], ["id"] + names[:0:-1]]  # partial lists, and all reversed
    for number, written in enumerate(lists):
        if "id" not in written:
            written = ["id"] + written
        table = f"t{number}_{'pk' if primary_key else 'log'}"
        _create(conn, table, primary_key)
        rows = [tuple(_value(c, r) for c in written) for r in range(1, 4)]
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} ({', '.join(written)}) VALUES "
                            f"({', '.join('?' * len(written))})", rows)
            assert cur.rowcount == len(rows)
        stored = _run(conn, f"SELECT {', '.join(names)} FROM {table} ORDER BY id")
        expected = [tuple(_value(c, r) if c in written else None for c in names) for r in range(1, 4)]
        assert stored == expected, f"INSERT INTO {table} ({', '.join(written)})"


def test_executemany_with_numbered_parameters_out_of_order(conn) -> None:
    _create(conn, "numbered", True)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO numbered (s, id, a) VALUES ($3, $1, $2)",
                        [(1, "a1", "s1"), (2, "a2", "s2")])
    assert _run(conn, "SELECT id, s, a FROM numbered ORDER BY id") == [(1, "s1", "a1"), (2, "s2", "a2")]


def test_sqlalchemy_insert_of_a_list_of_dicts_in_another_column_order(server, conn) -> None:
    _create(conn, "sw", True)
    _create(conn, "sw_log", False)
    engine = sa.create_engine(f"flightstore://127.0.0.1:{server.uri.rsplit(':', 1)[1]}/")
    try:
        metadata = sa.MetaData()  # declared in an order of its own, not reflected from the server
        columns = [("b", sa.String), ("n", sa.BigInteger), ("s", sa.String), ("a", sa.String)]
        pk = sa.Table("sw", metadata, *[sa.Column(c, t) for c, t in columns],
                      sa.Column("id", sa.BigInteger, primary_key=True))
        log = sa.Table("sw_log", metadata, sa.Column("id", sa.BigInteger), *[sa.Column(c, t) for c, t in columns])
        rows = [{"id": r, "a": f"a{r}", "b": f"b{r}", "s": f"s{r}", "n": r * 7} for r in range(1, 5)]
        with engine.begin() as connection:
            connection.execute(pk.insert(), rows)
            connection.execute(log.insert(), rows)
            for table in (pk, log):
                back = connection.execute(sa.select(table).order_by(table.c.id)).mappings().all()
                assert [dict(r) for r in back] == rows, table.name
    finally:
        engine.dispose()
