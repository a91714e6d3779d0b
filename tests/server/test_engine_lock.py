"""DuckDB's configuration is locked once the server opened it: no statement, whoever sends it and
whichever path it takes to the engine, changes the memory limit, the threads or anything else."""

from __future__ import annotations

import threading

import adbc_driver_manager
import duckdb
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi

from flightstore.errors import SqlError
from flightstore.server.service import FlightSqlServer
from flightstore.sql import partial
from flightstore.store import Store

CHANGES = ["SET memory_limit='500GB'", "SET threads=64", "SET GLOBAL memory_limit='500GB'",
           "PRAGMA threads=64", "RESET memory_limit", "SET enable_external_access=true",
           "SET lock_configuration=false"]
SETTINGS = "SELECT current_setting('memory_limit') AS m, current_setting('threads') AS t"


@pytest.fixture
def server(tmp_path):
    store = Store(tmp_path / "data", options={"query.memory-limit": "64MB"})
    server = FlightSqlServer(store, users={"admin": "adm1n", "reader": "r3ad"}, super_users=("admin",))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def _settings(uri: str, user: str, password: str) -> tuple:
    with dbapi.connect(uri, db_kwargs={"username": user, "password": password}, autocommit=True) as conn, \
            conn.cursor() as cur:
        cur.execute(SETTINGS)
        return cur.fetchall()[0]


def test_a_users_set_statements_are_refused_and_change_nothing(server):
    before = _settings(server.uri, "reader", "r3ad")
    assert before[0].startswith("61.0 MiB")  # query.memory-limit
    with dbapi.connect(server.uri, db_kwargs={"username": "reader", "password": "r3ad"}, autocommit=True) as conn:
        for statement in CHANGES:
            with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error):
                cur.execute(statement)
    assert _settings(server.uri, "reader", "r3ad") == before == _settings(server.uri, "admin", "adm1n")


def _engine_sql(engine, sql: str) -> list:
    return [batch for batch in engine.run(sql, {"x": pa.table({"a": [1]})})]


def test_sql_text_that_reaches_the_engine_cannot_change_its_configuration(server):
    """Whatever SQL text reaches the server's DuckDB (a cluster peer's partial aggregate is SQL
    text), configuration statements are refused: the configuration is locked."""
    engine = server.executor.engine
    before = _engine_sql(engine, SETTINGS)[0].to_pylist()
    for statement in CHANGES:
        with pytest.raises(SqlError, match="configuration has been locked"):
            _engine_sql(engine, statement)
    assert _engine_sql(engine, SETTINGS)[0].to_pylist() == before


def test_the_partial_aggregate_binder_is_locked_too(server):
    """Planning an aggregate binds its partial and merge steps in a DuckDB of their own."""
    import flightstore
    with flightstore.connect(server.uri, username="admin", password="adm1n", timeout=60) as admin:
        admin.sql("CREATE TABLE t (g BIGINT, v BIGINT)")
        admin.table("t").append({"g": [1, 1, 2], "v": [1, 2, 3]})
        assert admin.sql("SELECT g, SUM(v) AS s FROM t GROUP BY g ORDER BY g").to_pylist() == \
            [{"g": 1, "s": 3}, {"g": 2, "s": 3}]
    assert partial._engine is not None
    cursor = partial._engine.cursor()
    try:
        for statement in CHANGES:
            with pytest.raises(duckdb.Error, match="configuration has been locked"):
                cursor.execute(statement)
    finally:
        cursor.close()
