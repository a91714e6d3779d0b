"""Single-key lookups on a lookup stream answered without Arrow calls
(:mod:`flightstore.server.point_lookups`), against a real server: the answer equals
SELECT ... WHERE's for random present and missing keys of every integer key type, composite keys,
NULLs of every value type, any projection and the lookuper's key-index handles; keys the path does
not take (strings, partitioned tables, a value written before ALTER TABLE) are answered the
general way, and the same."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flightstore
from flightstore.sql.execute import StoreCatalog
from flightstore.sql.plan import plan as plan_sql
from tests.server.conftest import RunningServer

TIMEOUT = 60
ROWS = 40
VALUES = pa.schema([("s", pa.string()), ("ls", pa.large_string()), ("bin", pa.binary()), ("f", pa.bool_()),
                    ("d", pa.float64()), ("r", pa.float32()), ("dec", pa.decimal128(10, 2)),
                    ("day", pa.date32()), ("ts", pa.timestamp("us", "UTC")), ("t8", pa.int8()),
                    ("fb", pa.binary(3))])
#: table -> its key columns and types; each holds keys 0..ROWS-1 (negative in signed types)
KEYS = {"by_bigint": [("id", pa.int64())], "by_int": [("id", pa.int32())], "by_smallint": [("id", pa.int16())],
        "by_tinyint": [("id", pa.int8())], "by_uint": [("id", pa.uint64())],
        "by_pair": [("g", pa.int32()), ("id", pa.int64())], "by_text": [("id", pa.string())]}
FAST = [name for name in KEYS if name != "by_text"]


def _key_values(name: str, i: int) -> dict:
    columns = KEYS[name]
    if name == "by_pair":
        return {"g": i % 3, "id": i}
    t = columns[0][1]
    if pa.types.is_string(t):
        return {"id": f"k{i}"}
    return {"id": i if pa.types.is_unsigned_integer(t) else i - ROWS // 2}


def _value_rows(n: int) -> dict:
    def maybe(i: int, modulo: int, value):
        return None if i % modulo == 0 else value
    return {"s": [maybe(i, 2, f"s{i}") for i in range(n)], "ls": [maybe(i, 3, "é" * i) for i in range(n)],
            "bin": [maybe(i, 4, bytes([i]) * (i % 9)) for i in range(n)],
            "f": [maybe(i, 5, i % 2 == 0) for i in range(n)],
            "d": [maybe(i, 6, i / 3) for i in range(n)], "r": [maybe(i, 7, i * 0.5) for i in range(n)],
            "dec": [maybe(i, 2, decimal.Decimal(i) / 4) for i in range(n)],
            "day": [maybe(i, 3, dt.date(2026, 1, 1) + dt.timedelta(days=i)) for i in range(n)],
            "ts": [maybe(i, 4, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i))
                   for i in range(n)],
            "t8": [maybe(i, 5, i - 20) for i in range(n)], "fb": [maybe(i, 6, b"ab" + bytes([i])) for i in range(n)]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("points") / "data")
    for name, columns in KEYS.items():
        schema = pa.schema([*columns, *VALUES])
        table = running.store.create_table(name, schema, primary_key=[c for c, _ in columns],
                                           options={"bucket.num": "3", "bucket.key": columns[0][0]})
        keys = [_key_values(name, i) for i in range(ROWS)]
        data = {c: [k[c] for k in keys] for c, _ in columns} | _value_rows(ROWS)
        table.upsert(pa.table(data, schema=schema))
    part = pa.schema([("p", pa.int32()), ("id", pa.int64()), ("v", pa.string())])
    running.store.create_table("by_part", part, primary_key=["p", "id"], partition_keys=["p"],
                               options={"bucket.num": "2"})
    running.store.table("by_part").upsert(pa.table({"p": [i % 2 for i in range(ROWS)], "id": list(range(ROWS)),
                                                    "v": [None if i % 3 == 0 else f"v{i}" for i in range(ROWS)]},
                                                   schema=part))
    with flightstore.connect(running.uri, timeout=TIMEOUT) as conn:
        yield running, conn
    running.stop()


def _literal(value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def _selected(conn, table: str, key: dict, columns: list[str] | None) -> pa.Table:
    where = " AND ".join(f"{c} = {_literal(v)}" for c, v in key.items())
    return conn.sql(f"SELECT {', '.join(columns) if columns else '*'} FROM {table} WHERE {where}")


projections = st.one_of(st.none(), st.lists(st.sampled_from(["id", *VALUES.names]), min_size=1, max_size=5,
                                            unique=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(list(KEYS)), i=st.integers(-3, ROWS + 3), columns=projections)
def test_a_single_key_lookup_answers_what_select_where_answers(served, name, i, columns):
    running, conn = served
    if i < 0 or i >= ROWS:  # a missing key (in range of the key type)
        key = {c: (100 + i % 3 if c == "id" else v) for c, v in _key_values(name, 1).items()} \
            if name != "by_text" else {"id": f"missing{i}"}
    else:
        key = _key_values(name, i)
    before = running.server.metrics.point_lookups
    found = conn.table(name).lookup({c: [v] for c, v in key.items()}, columns)
    expected = _selected(conn, name, key, columns)
    assert found.schema.names == expected.schema.names
    assert found.schema.types == expected.schema.types
    assert found.to_pylist() == expected.to_pylist()
    assert found.num_rows == (0 <= i < ROWS)
    taken = running.server.metrics.point_lookups - before
    assert taken == (1 if name in FAST else 0)


def test_the_lookupers_single_keys_and_a_composite_key_in_any_order(served):
    """The lookuper's handle carries the key index: one key per request takes the path too."""
    running, conn = served
    before = running.server.metrics.point_lookups
    with conn.table("by_pair").lookuper(columns=["s", "dec"], options={"client.lookup.max-batch-size": 1}) as lk:
        for i in (3, 7, 39):
            assert lk.lookup_async({"id": i, "g": i % 3}).result(TIMEOUT).to_pylist() == \
                _selected(conn, "by_pair", _key_values("by_pair", i), ["s", "dec"]).to_pylist()
        assert lk.lookup_async({"g": 1, "id": 3}).result(TIMEOUT).num_rows == 0
    assert running.server.metrics.point_lookups - before == 4


def test_partitioned_and_several_keys_go_the_general_way(served):
    running, conn = served
    before = running.server.metrics.point_lookups
    for i in (0, 5, ROWS + 1):
        assert conn.table("by_part").lookup({"p": [i % 2], "id": [i]}).to_pylist() == \
            _selected(conn, "by_part", {"p": i % 2, "id": i}, None).to_pylist()
    keys = [_key_values("by_bigint", i)["id"] for i in (1, 2, 3)]
    assert conn.table("by_bigint").lookup({"id": keys}, ["s"]).to_pylist() == \
        [_selected(conn, "by_bigint", {"id": k}, ["s"]).to_pylist()[0] for k in keys]
    assert running.server.metrics.point_lookups == before


def test_a_row_written_before_alter_table_is_answered_conformed(tmp_path):
    """A value of an older schema version is decoded and conformed (the added column NULL) the
    general way; a row written after the ALTER takes the path: both as SELECT answers them."""
    running = RunningServer(tmp_path / "data")
    try:
        with flightstore.connect(running.uri, timeout=TIMEOUT) as conn:
            conn.sql("CREATE TABLE kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
            conn.sql("INSERT INTO kv VALUES (1, 'one')")
            table = conn.table("kv")
            assert table.lookup({"id": [1]}).to_pylist() == [{"id": 1, "v": "one"}]
            conn.sql("ALTER TABLE kv ADD COLUMN w BIGINT")
            conn.sql("INSERT INTO kv VALUES (2, 'two', 22)")
            before = running.server.metrics.point_lookups
            assert table.lookup({"id": [1]}).to_pylist() == _selected(conn, "kv", {"id": 1}, None).to_pylist() == \
                [{"id": 1, "v": "one", "w": None}]
            assert running.server.metrics.point_lookups == before
            assert table.lookup({"id": [2]}).to_pylist() == [{"id": 2, "v": "two", "w": 22}]
            assert running.server.metrics.point_lookups == before + 1
    finally:
        running.stop()


# ---- the SQL point route (flightstore.sql.execute.lookups.point_row) ------------------------------
def _flight_sql(conn, sql: str) -> pa.Table:
    """A statement as ADBC and JDBC send it: GetFlightInfo of a CommandStatementQuery, then DoGet."""
    from pyarrow import flight

    from flightstore.server import protocol
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(command))
    return conn._client.do_get(info.endpoints[0].ticket).read_all()


def test_literal_and_prepared_sql_point_lookups_skip_planning_and_answer_the_same(served, monkeypatch):
    """Once a shape is learned, literal SQL (one DoGet, or GetFlightInfo + DoGet) and ADBC's
    prepared lookups of integer keys are answered without planning, rows and schema as the plan
    answers them (present, missing, NULLs, projections, composite keys)."""
    import adbc_driver_flightsql.dbapi as flightsql

    running, conn = served
    statements = [(f"SELECT {cols} FROM {name} WHERE " + " AND ".join(f"{c} = {v}" for c, v in key.items()))
                  for name in ("by_bigint", "by_tinyint", "by_pair")
                  for cols in ("*", "s, dec, id")
                  for key in (_key_values(name, 1), _key_values(name, 7),
                              {c: (100 if c == "id" else v) for c, v in _key_values(name, 1).items()})]
    executor = running.server.executor
    for sql in statements:  # every shape is learned
        conn.sql(sql)
    fresh = [plan_sql(sql, StoreCatalog(running.store)) for sql in statements]
    expected = [executor.execute_table(plan, executor.output_schema(plan)) for plan in fresh]
    planned = []
    real = running.server.executor.plan
    monkeypatch.setattr(running.server.executor, "plan", lambda *a, **k: planned.append(a[0]) or real(*a, **k))
    for sql, answer in zip(statements, expected):
        for got in (conn.sql(sql), _flight_sql(conn, sql)):
            assert got.schema.equals(answer.schema) and got.to_pylist() == answer.to_pylist(), sql
    assert planned == []
    with flightsql.connect(running.uri, autocommit=True) as adbc, adbc.cursor() as cursor:
        cursor.execute("SELECT s, id FROM by_bigint WHERE id = ?", (3,))  # learns the shape
        planned.clear()
        for i in (-5, 0, 12, 999):
            cursor.execute("SELECT s, id FROM by_bigint WHERE id = ?", (i,))
            assert cursor.fetch_arrow_table().to_pylist() == conn.sql(
                f"SELECT s, id FROM by_bigint WHERE id = {i}").to_pylist()
    assert planned == []


def test_the_sql_point_route_keeps_grants_and_hidden_tables(tmp_path):
    """A caller without READ gets, after the shape was learned, exactly the error it got before."""
    from tests.server.test_privilege_matrix import Env

    env = Env(tmp_path / "data")
    try:
        admin = env.client("admin")
        admin.sql("CREATE DATABASE shop")
        admin.sql("CREATE TABLE shop.kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
        admin.sql("CREATE TABLE shop.other (id BIGINT, v STRING)")
        admin.sql("INSERT INTO shop.kv VALUES (1, 'one')")
        admin.sql("GRANT READ ON TABLE shop.other TO USER neighbour")
        admin.sql("GRANT DESCRIBE ON TABLE shop.kv TO USER describer")
        admin.sql("GRANT READ ON TABLE shop.kv TO USER reader")
        sql = "SELECT * FROM shop.kv WHERE id = {}"
        before = {}
        for user in ("stranger", "neighbour", "describer"):  # no shape learned yet: planned
            with pytest.raises(Exception) as refused:
                env.client(user).sql(sql.format(2))
            before[user] = (type(refused.value), str(refused.value))
        assert admin.sql(sql.format(1)).to_pylist() == [{"id": 1, "v": "one"}]  # learns the shape
        for user, (kind, message) in before.items():
            with pytest.raises(kind) as refused:
                env.client(user).sql(sql.format(3))
            assert str(refused.value).replace("3", "2") == message
        assert env.client("reader").sql(sql.format(1)).to_pylist() == [{"id": 1, "v": "one"}]
    finally:
        env.stop()
