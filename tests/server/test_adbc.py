"""The ADBC Flight SQL driver (adbc_driver_flightsql) against a real flightstore server.

ADBC always prepares, sends DDL and DML on the query path, binds parameters through DoPut and
checks that FlightInfo's schema equals the stream's: every call below exercises that wire path.
"""

from __future__ import annotations

import warnings

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from adbc_driver_flightsql import dbapi


@pytest.fixture
def conn(server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot disable autocommit" when transactions are absent
        connection = dbapi.connect(server.uri, autocommit=True)
    yield connection
    connection.close()


def _query(conn, sql: str, params=None) -> pa.Table:
    with conn.cursor() as cur:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        return cur.fetch_arrow_table()


def _rows(conn, sql: str, params=None) -> list[dict]:
    return _query(conn, sql, params).to_pylist()


def _explain(conn, sql: str) -> str:
    table = _query(conn, "EXPLAIN " + sql)
    assert table.column_names == ["plan"]
    return "\n".join(table.column("plan").to_pylist())


USERS_DDL = ("CREATE TABLE shop.users (id BIGINT, name STRING, score DOUBLE, "
             "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '4')")


def _users(conn) -> None:
    assert _rows(conn, "CREATE DATABASE shop") == [{"rows_affected": 0}]
    _rows(conn, USERS_DDL)
    assert _rows(conn, "INSERT INTO shop.users VALUES (1, 'a', 1.0), (2, 'b', 2.0), (3, 'c', 3.0)") \
        == [{"rows_affected": 3}]


# ---- DDL and writes -----------------------------------------------------------------------------
def test_ddl_upsert_partial_update_and_delete(server, conn) -> None:
    _users(conn)
    descriptor = server.store.table("shop.users").descriptor
    assert list(descriptor.primary_key) == ["id"]
    assert server.store.table("shop.users").num_buckets == 4
    # an INSERT on a primary-key table is an upsert
    _rows(conn, "INSERT INTO shop.users VALUES (2, 'bb', 22.0)")
    # a partial update keeps the columns it does not name
    _rows(conn, "INSERT INTO shop.users (id, score) VALUES (3, 33.0)")
    assert _rows(conn, "DELETE FROM shop.users WHERE id = 1") == [{"rows_affected": 1}]
    assert _rows(conn, "SELECT * FROM shop.users ORDER BY id") == [
        {"id": 2, "name": "bb", "score": 22.0}, {"id": 3, "name": "c", "score": 33.0}]
    assert server.store.table("shop.users").row_count() == 2


# ---- each read route ----------------------------------------------------------------------------
def test_routes_point_prefix_limit_count_scan(conn) -> None:
    _users(conn)
    # point lookup, = and IN
    assert "PointLookup" in _explain(conn, "SELECT * FROM shop.users WHERE id = 2")
    assert _rows(conn, "SELECT * FROM shop.users WHERE id = 2") == [{"id": 2, "name": "b", "score": 2.0}]
    assert "PointLookup" in _explain(conn, "SELECT name FROM shop.users WHERE id IN (3, 1, 99)")
    assert sorted(_query(conn, "SELECT name FROM shop.users WHERE id IN (3, 1, 99)")
                  .column("name").to_pylist()) == ["a", "c"]
    # prefix lookup: the bucket key is a strict prefix of the primary key
    _rows(conn, "CREATE TABLE shop.events (user_id BIGINT, seq BIGINT, v STRING, "
                "PRIMARY KEY (user_id, seq) NOT ENFORCED) "
                "WITH ('bucket.num' = '4', 'bucket.key' = 'user_id')")
    _rows(conn, "INSERT INTO shop.events VALUES (1, 1, 'a'), (1, 2, 'b'), (2, 1, 'c'), (3, 7, 'd')")
    assert "PrefixLookup" in _explain(conn, "SELECT * FROM shop.events WHERE user_id = 1")
    assert _rows(conn, "SELECT seq, v FROM shop.events WHERE user_id = 1") == [
        {"seq": 1, "v": "a"}, {"seq": 2, "v": "b"}]
    # LIMIT
    assert "limit=2" in _explain(conn, "SELECT * FROM shop.events LIMIT 2")
    assert _query(conn, "SELECT * FROM shop.events LIMIT 2").num_rows == 2
    # COUNT(*) from maintained counts
    assert _explain(conn, "SELECT COUNT(*) FROM shop.events").startswith("Count(")
    assert _query(conn, "SELECT COUNT(*) AS n FROM shop.events").to_pylist() == [{"n": 4}]
    # filtered, column-pruned scan
    explained = _explain(conn, "SELECT v FROM shop.events WHERE seq > 1")
    assert explained.startswith("Scan(") and "columns=[v]" in explained
    result = _query(conn, "SELECT v FROM shop.events WHERE seq > 1")
    assert result.column_names == ["v"]
    assert sorted(result.column("v").to_pylist()) == ["b", "d"]


def test_changelog_and_binlog(conn) -> None:
    _users(conn)
    _rows(conn, "INSERT INTO shop.users VALUES (2, 'bb', 22.0)")
    _rows(conn, "DELETE FROM shop.users WHERE id = 1")
    assert "Changelog" in _explain(conn, "SELECT * FROM shop.users$changelog")
    log = _query(conn, "SELECT * FROM shop.users$changelog")
    assert log.column_names == ["id", "name", "score", "_change_type", "_log_offset", "_commit_timestamp"]
    assert pa.types.is_timestamp(log.schema.field("_commit_timestamp").type)
    by_key: dict[int, list[tuple[str, int]]] = {}
    for row in log.to_pylist():
        by_key.setdefault(row["id"], []).append((row["_change_type"], row["name"]))
        assert row["_commit_timestamp"] is not None and row["_log_offset"] >= 0
    assert by_key == {1: [("+I", "a"), ("-D", "a")], 2: [("+I", "b"), ("-U", "b"), ("+U", "bb")],
                      3: [("+I", "c")]}
    assert log.num_rows == 6

    binlog = _query(conn, "SELECT * FROM shop.users$binlog")
    assert binlog.column_names == ["_change_type", "_log_offset", "_commit_timestamp", "before", "after"]
    kinds = sorted((r["_change_type"], (r["before"] or {}).get("name"), (r["after"] or {}).get("name"))
                   for r in binlog.to_pylist())
    assert kinds == [("delete", "a", None), ("insert", None, "a"), ("insert", None, "b"),
                     ("insert", None, "c"), ("update", "b", "bb")]


# ---- prepared statements with parameters --------------------------------------------------------
def test_bound_parameters_and_executemany(server, conn) -> None:
    _users(conn)
    assert _rows(conn, "SELECT name, score FROM shop.users WHERE id = ?", (2,)) == [{"name": "b", "score": 2.0}]
    assert _rows(conn, "SELECT name FROM shop.users WHERE id = ?", (3,)) == [{"name": "c"}]
    assert _rows(conn, "INSERT INTO shop.users VALUES (?, ?, ?)", (7, "x", 7.5)) == [{"rows_affected": 1}]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO shop.users VALUES (?, ?, ?)",
                        [(8, "y", 8.0), (9, "z", 9.0), (2, "b2", 2.5)])
        assert cur.rowcount == 3
    assert server.store.table("shop.users").row_count() == 6
    with conn.cursor() as cur:  # the same key twice in one batch: the later row wins
        cur.executemany("INSERT INTO shop.users (id, name) VALUES (?, ?)", [(1, "first"), (1, "second")])
        assert cur.rowcount == 2
    assert _rows(conn, "SELECT name, score FROM shop.users WHERE id = 1") == [{"name": "second", "score": 1.0}]
    _rows(conn, "INSERT INTO shop.users (id, name) VALUES (1, 'a')")
    assert _rows(conn, "SELECT * FROM shop.users ORDER BY id") == [
        {"id": 1, "name": "a", "score": 1.0}, {"id": 2, "name": "b2", "score": 2.5},
        {"id": 3, "name": "c", "score": 3.0}, {"id": 7, "name": "x", "score": 7.5},
        {"id": 8, "name": "y", "score": 8.0}, {"id": 9, "name": "z", "score": 9.0}]


def test_a_prepared_lookup_answers_the_new_schema_after_alter_and_drop(conn) -> None:
    """One cursor re-executes a prepared point lookup (ADBC keeps its handle; the server keeps
    its plan templates, prepare answers and result schemas): after ALTER TABLE, and after DROP
    and CREATE of another table of the same name, it answers the table as it is now."""
    _users(conn)
    lookup = "SELECT * FROM shop.users WHERE id = ?"
    with conn.cursor() as cur:
        for key in (1, 2, 1):  # warm: the shape's template and the result's schema are cached
            cur.execute(lookup, (key,))
            assert cur.fetch_arrow_table().column_names == ["id", "name", "score"]
        with conn.cursor() as ddl:
            ddl.execute("ALTER TABLE shop.users ADD COLUMN note STRING")
            ddl.fetchall()
            ddl.execute("INSERT INTO shop.users VALUES (4, 'd', 4.0, 'new')")
            ddl.fetchall()
        for key, note in ((1, None), (4, "new")):
            cur.execute(lookup, (key,))
            got = cur.fetch_arrow_table()
            assert got.schema.field("note").type == pa.string()
            assert got.to_pylist() == [{"id": key, "name": "ad"[key // 4], "score": float(key), "note": note}]
        with conn.cursor() as ddl:
            ddl.execute("DROP TABLE shop.users")
            ddl.fetchall()
            ddl.execute("CREATE TABLE shop.users (id BIGINT, tag STRING, PRIMARY KEY (id) NOT ENFORCED) "
                        "WITH ('bucket.num' = '2')")
            ddl.fetchall()
            ddl.execute("INSERT INTO shop.users VALUES (1, 'fresh')")
            ddl.fetchall()
        cur.execute(lookup, (1,))
        assert cur.fetch_arrow_table().to_pylist() == [{"id": 1, "tag": "fresh"}]
        cur.execute(lookup, (4,))
        got = cur.fetch_arrow_table()
        assert got.column_names == ["id", "tag"] and got.num_rows == 0


def _chunked(table: pa.Table, rows: int = 100_000) -> pa.Table:
    """The driver sends one Flight message per batch and refuses messages above 16 MiB itself."""
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), table.schema)


# ---- bulk ingest --------------------------------------------------------------------------------
def test_ingest_a_million_rows_create_then_append(server, conn) -> None:
    n = 1_000_000
    rng = np.random.default_rng(7)
    data = _chunked(pa.table({"id": pa.array(np.arange(n, dtype=np.int64)),
                              "amount": pa.array(rng.random(n)),
                              "qty": pa.array(rng.integers(0, 1000, n, dtype=np.int64))}))
    with conn.cursor() as cur:
        assert cur.adbc_ingest("big", data, mode="create") == n
    assert _rows(conn, "SELECT COUNT(*) AS n FROM big") == [{"n": n}]
    sums = _rows(conn, "SELECT SUM(qty) AS q, SUM(amount) AS a FROM big")[0]
    assert sums["q"] == pc.sum(data["qty"]).as_py()
    assert sums["a"] == pytest.approx(pc.sum(data["amount"]).as_py(), rel=1e-9)

    extra = data.slice(0, 1000)
    with conn.cursor() as cur:
        assert cur.adbc_ingest("big", extra, mode="append") == 1000
    assert _rows(conn, "SELECT COUNT(*) AS n FROM big") == [{"n": n + 1000}]
    assert _rows(conn, "SELECT SUM(qty) AS q FROM big")[0]["q"] == \
        pc.sum(data["qty"]).as_py() + pc.sum(extra["qty"]).as_py()
    assert server.store.table("big").row_count() == n + 1000


def test_temporary_tables_are_refused_and_nothing_is_created(server, conn) -> None:
    """flightstore has no session-scoped tables: a temporary ingest or CREATE TEMPORARY TABLE is
    refused by name rather than making a table every connection sees."""
    with conn.cursor() as cur:
        with pytest.raises(dbapi.NotSupportedError, match="temporary tables are not supported"):
            cur.adbc_ingest("scratch", pa.table({"a": [1, 2]}), mode="create", temporary=True)
    with conn.cursor() as cur:  # a fresh cursor: the driver's ingest state does not survive an error
        with pytest.raises(dbapi.NotSupportedError, match="temporary tables are not supported"):
            cur.execute("CREATE TEMPORARY TABLE scratch2 (a BIGINT)")
        assert cur.adbc_ingest("kept", pa.table({"a": [1, 2]}), mode="create") == 2
        cur.execute("SHOW TABLES")
        assert cur.fetchall() == [("kept",)]
    assert server.store.list_tables("default") == ["kept"]


# ---- metadata -----------------------------------------------------------------------------------
def test_get_objects_table_schema_and_info(conn) -> None:
    _users(conn)
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "flightstore"
    assert info["vendor_version"]
    assert info["vendor_arrow_version"] == pa.__version__

    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["flightstore"]
    schemas = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}
    assert {"default", "shop"} <= set(schemas)
    tables = {t["table_name"]: t for t in schemas["shop"]["db_schema_tables"]}
    assert tables["users"]["table_type"] == "TABLE"
    columns = [(c["column_name"], c["ordinal_position"], c["xdbc_type_name"])
               for c in tables["users"]["table_columns"]]
    assert columns == [("id", 1, "BIGINT"), ("name", 2, "STRING"), ("score", 3, "DOUBLE")]

    schema = conn.adbc_get_table_schema("users", db_schema_filter="shop")
    assert [(f.name, f.type) for f in schema] == [
        ("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())]
    assert not schema.field("id").nullable
    assert conn.adbc_get_table_types() == ["TABLE"]


# ---- residual SQL: answers exactly what DuckDB answers ------------------------------------------
def test_group_by_join_order_by_match_duckdb(conn) -> None:
    rng = np.random.default_rng(3)
    n = 5000
    orders = pa.table({"order_id": pa.array(np.arange(n, dtype=np.int64)),
                       "customer_id": pa.array(rng.integers(0, 50, n, dtype=np.int64)),
                       "amount": pa.array(np.round(rng.random(n) * 100, 2))})
    customers = pa.table({"customer_id": pa.array(np.arange(60, dtype=np.int64)),
                          "region": pa.array([f"r{i % 5}" for i in range(60)])})
    _rows(conn, "CREATE TABLE orders (order_id BIGINT, customer_id BIGINT, amount DOUBLE, "
                "PRIMARY KEY (order_id) NOT ENFORCED) WITH ('bucket.num' = '4')")
    _rows(conn, "CREATE TABLE customers (customer_id BIGINT, region STRING, "
                "PRIMARY KEY (customer_id) NOT ENFORCED) WITH ('bucket.num' = '2')")
    with conn.cursor() as cur:
        cur.adbc_ingest("orders", orders, mode="append")
        cur.adbc_ingest("customers", customers, mode="append")

    queries = [
        ("SELECT customer_id, COUNT(*) AS n, SUM(amount) AS total FROM orders "
         "GROUP BY customer_id ORDER BY customer_id"),
        ("SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MAX(o.amount) AS top "
         "FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
         "GROUP BY c.region ORDER BY c.region"),
        "SELECT order_id, amount FROM orders ORDER BY amount DESC, order_id LIMIT 10",
    ]
    memory = duckdb.connect()
    memory.register("orders", orders)
    memory.register("customers", customers)
    for sql in queries:
        expected = memory.sql(sql).to_arrow_table()
        got = _query(conn, sql)
        assert got.column_names == expected.column_names, sql
        for name in expected.column_names:
            want, have = expected.column(name).to_pylist(), got.column(name).to_pylist()
            if pa.types.is_floating(expected.schema.field(name).type):
                assert have == pytest.approx(want), (sql, name)
            else:
                assert have == want, (sql, name)


def test_select_one_and_order_by(conn) -> None:
    assert list(_query(conn, "SELECT 1").to_pydict().values()) == [[1]]
    assert _rows(conn, "SELECT 1 AS one, 'x' AS s") == [{"one": 1, "s": "x"}]
    _users(conn)
    assert _query(conn, "SELECT name FROM shop.users ORDER BY score DESC").column("name").to_pylist() \
        == ["c", "b", "a"]


# ---- results far above gRPC's 16 MiB message limit ---------------------------------------------
def test_result_larger_than_the_grpc_limit_streams(conn) -> None:
    n = 300_000
    rng = np.random.default_rng(11)
    data = _chunked(pa.table({f"c{i}": pa.array(rng.random(n)) for i in range(10)}))
    assert data.nbytes > 16 * 1024 * 1024
    with conn.cursor() as cur:
        cur.adbc_ingest("wide", data, mode="create")
    got = _query(conn, "SELECT * FROM wide")
    assert got.num_rows == n
    assert got.column_names == data.column_names
    assert got.sort_by("c0").equals(data.sort_by("c0"))
    # the residual route (DuckDB) streams just as well
    ordered = _query(conn, "SELECT * FROM wide ORDER BY c0")
    assert ordered.num_rows == n
    assert ordered.column("c0").to_pylist() == data.sort_by("c0").column("c0").to_pylist()


def test_use_is_per_connection(server, conn) -> None:
    """Each ADBC connection is its own session: one connection's USE leaves the others alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = dbapi.connect(server.uri, autocommit=True)
    try:
        _query(conn, "CREATE DATABASE shop")
        _query(conn, "USE shop")
        _query(conn, "CREATE TABLE t (a BIGINT)")
        _query(other, "CREATE TABLE t (a BIGINT)")
        _query(conn, "INSERT INTO t VALUES (1)")
        _query(other, "INSERT INTO t VALUES (2), (3)")
        assert _rows(conn, "SELECT COUNT(*) AS n FROM t") == [{"n": 1}]
        assert _rows(other, "SELECT COUNT(*) AS n FROM t") == [{"n": 2}]
        assert _rows(conn, "SELECT a FROM t WHERE a = ?", (1,)) == [{"a": 1}]  # prepared: shop
    finally:
        other.close()


# ---- current catalog / schema and endpoints through session options ----------------------------
def test_current_db_schema_is_the_session_database(server, conn) -> None:
    """``adbc_current_db_schema`` gets and sets the database unqualified names resolve in (the
    ``schema`` session option), and agrees with ``USE`` both ways."""
    _users(conn)
    assert conn.adbc_current_catalog == "flightstore"
    assert conn.adbc_current_db_schema == "default"
    conn.adbc_current_db_schema = "shop"
    assert conn.adbc_current_db_schema == "shop"
    assert _rows(conn, "SELECT name FROM users WHERE id = 2") == [{"name": "b"}]
    assert _rows(conn, "SELECT COUNT(*) AS n FROM users") == [{"n": 3}]
    _rows(conn, "USE `default`")
    assert conn.adbc_current_db_schema == "default"
    _rows(conn, "USE shop")
    assert conn.adbc_current_db_schema == "shop"
    with pytest.raises(Exception, match="schema"):
        conn.adbc_current_db_schema = "no_such_db"
    assert conn.adbc_current_db_schema == "shop"   # a refused setting changes nothing
    with pytest.raises(Exception, match="catalog"):
        conn.adbc_current_catalog = "elsewhere"
    assert conn.adbc_current_catalog == "flightstore"


def test_per_bucket_endpoints_are_a_session_option(conn) -> None:
    """One partition by default; ADBC can ask for one per bucket (``adbc_execute_partitions``)."""
    _users(conn)
    with conn.cursor() as cur:
        partitions, _ = cur.adbc_execute_partitions("SELECT * FROM shop.users")
        assert len(partitions) == 1
        conn.adbc_connection.set_options(
            **{"adbc.flight.sql.session.optionbool.flightstore.per-bucket-endpoints": "true"})
        partitions, _ = cur.adbc_execute_partitions("SELECT * FROM shop.users")
        assert len(partitions) == 4
        rows = []
        for partition in partitions:
            cur.adbc_read_partition(partition)
            rows += cur.fetch_arrow_table().column("id").to_pylist()
        assert sorted(rows) == [1, 2, 3]


# ---- NULL ordering: what SqlInfo advertises is what ORDER BY does ------------------------------
def test_null_ordering_is_the_advertised_one(conn) -> None:
    """SQL_NULL_ORDERING (507) says "sorted at end": NULLs last in both directions, as in DuckDB,
    unless the query asks for NULLS FIRST."""
    _rows(conn, "CREATE TABLE notes (id BIGINT, note STRING) WITH ('bucket.num' = '2')")
    _rows(conn, "INSERT INTO notes VALUES (1, 'b'), (2, NULL), (3, 'a'), (4, NULL), (5, 'c')")
    local = duckdb.connect()
    local.execute("CREATE TABLE notes AS SELECT * FROM (VALUES (1, 'b'), (2, NULL), (3, 'a'), "
                  "(4, NULL), (5, 'c')) v(id, note)")
    cases = {
        "ORDER BY note, id": [3, 1, 5, 2, 4],
        "ORDER BY note DESC, id": [5, 1, 3, 2, 4],
        "ORDER BY note NULLS FIRST, id": [2, 4, 3, 1, 5],
        "ORDER BY note DESC NULLS FIRST, id": [2, 4, 5, 1, 3],
        "ORDER BY note ASC NULLS LAST, id": [3, 1, 5, 2, 4],
    }
    for order, expected in cases.items():
        got = [r["id"] for r in _rows(conn, f"SELECT id, note FROM notes {order}")]
        assert got == expected, order
        assert got == [r[0] for r in local.execute(f"SELECT id, note FROM notes {order}").fetchall()], order
    ranked = _rows(conn, "SELECT id, ROW_NUMBER() OVER (ORDER BY note, id) AS r FROM notes ORDER BY r")
    assert [r["id"] for r in ranked] == [3, 1, 5, 2, 4]


def test_sql_null_ordering_sql_info(server) -> None:
    from pyarrow import flight

    from flightstore.server import protocol
    client = flight.FlightClient(server.uri)
    try:
        command = protocol.pack_any(protocol.CommandGetSqlInfo(info=[507]))
        info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        [row] = table.to_pylist()
        assert row["info_name"] == 507
        assert row["value"] == 3  # SQL_NULLS_SORTED_AT_END
    finally:
        client.close()
