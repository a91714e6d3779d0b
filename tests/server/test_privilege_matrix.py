"""The privilege matrix of one server (docs/security.md): every RPC kind and SQL verb, run against
table ``shop.secret`` by users holding no grant at all, a grant elsewhere in ``shop`` only,
DESCRIBE, READ or WRITE on it. Each answer is the documented one, and where the object is
hidden from the user, the answer equals word for word (names aside) the answer for an absent
object: ``nodb.secret`` when the user sees no ``shop`` either, ``shop.nosuch`` otherwise.

One server for the module, small tables; each user keeps one client connection and one ADBC
connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import adbc_driver_manager
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.errors import InvalidOption
from flightstore.server import protocol
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

TIMEOUT = 60
PASSWORD = "pw"
ELSEWHERE = "READ ON TABLE shop.other"
GRANTS = {  # every user but the stranger reads shop.other: shop is listed to them
    "stranger": [],
    "neighbour": [ELSEWHERE],
    "describer": [ELSEWHERE, "DESCRIBE ON TABLE shop.secret"],
    "reader": [ELSEWHERE, "READ ON TABLE shop.secret"],
    "writer": [ELSEWHERE, "WRITE ON TABLE shop.secret"],
}
LEVELS = tuple(GRANTS)


class Env:
    def __init__(self, data_dir) -> None:
        self.store = Store(data_dir)
        users = {name: PASSWORD for name in ("admin", *LEVELS)}
        self.server = FlightSqlServer(self.store, users=users, super_users=("admin",))
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri
        self._clients: dict[str, flightstore.Connection] = {}
        self._adbc: dict[str, object] = {}

    def client(self, user: str) -> flightstore.Connection:
        if user not in self._clients:
            self._clients[user] = flightstore.connect(self.uri, username=user, password=PASSWORD, timeout=TIMEOUT)
        return self._clients[user]

    def adbc(self, user: str):
        if user not in self._adbc:
            self._adbc[user] = dbapi.connect(self.uri, db_kwargs={"username": user, "password": PASSWORD},
                                             autocommit=True)
        return self._adbc[user]

    def stop(self) -> None:
        for conn in [*self._clients.values(), *self._adbc.values()]:
            conn.close()
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    running = Env(tmp_path_factory.mktemp("matrix") / "data")
    admin = running.client("admin")
    admin.sql("CREATE DATABASE shop")
    admin.sql("CREATE TABLE shop.secret (id BIGINT, region STRING, ssn BIGINT, v STRING, "
              "PRIMARY KEY (id, region) NOT ENFORCED) PARTITIONED BY (region) WITH ('bucket.num' = '1')")
    admin.sql("CREATE TABLE shop.other (id BIGINT, v STRING)")
    admin.sql("INSERT INTO shop.secret VALUES (1, 'eu', 123456789, 'classified')")
    admin.sql("INSERT INTO shop.other VALUES (1, 'o')")
    admin.table("shop.secret").snapshot(force=True)  # read snapshot: one to read
    for user, grants in GRANTS.items():
        for grant in grants:
            admin.sql(f"GRANT {grant} TO {user}")
    yield running
    running.stop()


# ---- the calls: each takes (env, user, database, table) and returns what the user saw ----------
def sql(template: str) -> Callable:
    """The Python client's SQL (one DoGet)."""
    def run(env: Env, user: str, db: str, t: str):
        return env.client(user).sql(template.format(db=db, t=t)).to_pylist()
    return run


def adbc(template: str, params: tuple | None = None) -> Callable:
    """ADBC: CreatePreparedStatement, GetFlightInfo, DoGet (DoPut to bind ``params``)."""
    def run(env: Env, user: str, db: str, t: str):
        with env.adbc(user).cursor() as cur:
            cur.execute(template.format(db=db, t=t), params)
            return cur.fetchall()
    return run


def adbc_many(template: str, rows: list) -> Callable:
    def run(env: Env, user: str, db: str, t: str):
        with env.adbc(user).cursor() as cur:
            cur.executemany(template.format(db=db, t=t), rows)
    return run


def ingest(env: Env, user: str, db: str, t: str):
    data = pa.table({"id": pa.array([7], pa.int64()), "region": ["eu"], "ssn": pa.array([7], pa.int64()),
                     "v": ["i"]})
    with env.adbc(user).cursor() as cur:
        return cur.adbc_ingest(t, data, mode="append", db_schema_name=db)


def flight_sql_query(env: Env, user: str, db: str, t: str):
    """Raw Flight SQL: GetFlightInfo(CommandStatementQuery), then DoGet of its ticket."""
    conn = env.client(user)
    command = protocol.pack_any(protocol.CommandStatementQuery(query=f"SELECT v FROM {db}.{t}"))
    info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(command), conn._options)
    return conn.read_info(info).to_pylist()


def flight_sql_update(env: Env, user: str, db: str, t: str):
    """Raw Flight SQL: DoPut(CommandStatementUpdate)."""
    return env.client(user).execute(f"INSERT INTO {db}.{t} VALUES (2, 'eu', 2, 'u')")


def table_call(action: Callable) -> Callable:
    """flightstore's own commands (DoGet / DoPut / DoAction) through the Python client."""
    def run(env: Env, user: str, db: str, t: str):
        return action(env.client(user).table(f"{db}.{t}", writer_id="matrix"))
    return run


def first_batch(table) -> list:
    with table.subscribe("earliest") as subscription:
        return next(iter(subscription)).to_pylist()


def primary_keys(env: Env, user: str, db: str, t: str):
    conn = env.client(user)
    command = protocol.CommandGetPrimaryKeys(table=t, db_schema=db)
    info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(protocol.pack_any(command)),
                                        conn._options)
    return conn.read_info(info).column("column_name").to_pylist()


def get_tables(env: Env, user: str, db: str, t: str):
    objects = env.adbc(user).adbc_get_objects(depth="tables", db_schema_filter=db,
                                              table_name_filter=t).read_all().to_pylist()
    return [(s["db_schema_name"], [x["table_name"] for x in s["db_schema_tables"] or []])
            for c in objects for s in c["catalog_db_schemas"] or []]


def get_db_schemas(env: Env, user: str, db: str, t: str):
    objects = env.adbc(user).adbc_get_objects(depth="db_schemas", db_schema_filter=db).read_all().to_pylist()
    return [s["db_schema_name"] for c in objects for s in c["catalog_db_schemas"] or []]


def action(kind: str, field: str) -> Callable:
    """A flightstore action on the table, answering one field."""
    def run(table):
        return table.connection._action(kind, {"table": table.name})[field]
    return run


def changelog(table) -> int:
    bucket = min(table.offsets())
    return table.connection._get({"op": "changelog", "table": table.name, "bucket": bucket}).read_all().num_rows


def read_snapshot(table) -> int:
    bucket, at = next(iter(table.offsets().items()))
    return table.read_snapshot(bucket, at).num_rows


def session_schema(env: Env, user: str, db: str, t: str):
    env.client(user).set_session_options({"schema": db})


OK, ABSENT, INVALID = "ok", "absent", "invalid"


def denied(operation: str, resource: str = "table {db}.{t}") -> tuple[str, str]:
    return ("denied", f"{operation} {resource}")


R, W = denied("READ"), denied("WRITE")
TABLE_LEVEL = (ABSENT, ABSENT)  # the stranger's and the neighbour's answer for anything about shop.secret


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable
    expected: tuple  # one answer per level, LEVELS order


CASES = [
    # SQL verbs (Python client: one DoGet)
    Case("SELECT scan", sql("SELECT v FROM {db}.{t}"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT unknown column", sql("SELECT nosuchcol FROM {db}.{t}"), (*TABLE_LEVEL, INVALID, INVALID, INVALID)),
    Case("SELECT typed filter", sql("SELECT v FROM {db}.{t} WHERE ssn = DATE '2020-01-01'"),
         (*TABLE_LEVEL, INVALID, INVALID, INVALID)),
    Case("SELECT point lookup", sql("SELECT v FROM {db}.{t} WHERE id = 1 AND region = 'eu'"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT COUNT", sql("SELECT COUNT(*) AS n FROM {db}.{t}"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT join", sql("SELECT o.v FROM {db}.other o JOIN {db}.{t} s ON o.id = s.id"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT $changelog", sql("SELECT * FROM `{db}`.`{t}$changelog`"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT $binlog", sql("SELECT * FROM `{db}`.`{t}$binlog`"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT $partitions", sql("SELECT * FROM `{db}`.`{t}$partitions`"), (*TABLE_LEVEL, R, OK, R)),
    Case("SELECT $lake", sql("SELECT * FROM `{db}`.`{t}$lake`"), (*TABLE_LEVEL, INVALID, INVALID, INVALID)),
    Case("INSERT VALUES", sql("INSERT INTO {db}.{t} VALUES (3, 'eu', 3, 'w')"), (*TABLE_LEVEL, W, W, OK)),
    Case("INSERT wrong columns", sql("INSERT INTO {db}.{t} VALUES (3)"), (*TABLE_LEVEL, INVALID, INVALID, INVALID)),
    Case("INSERT SELECT", sql("INSERT INTO {db}.{t} SELECT * FROM {db}.{t}"), (*TABLE_LEVEL, W, W, R)),
    Case("UPDATE WHERE", sql("UPDATE {db}.{t} SET v = 'z' WHERE id = 1 AND region = 'eu'"), (*TABLE_LEVEL, W, W, R)),
    Case("DELETE WHERE", sql("DELETE FROM {db}.{t} WHERE id = 99 AND region = 'eu'"), (*TABLE_LEVEL, W, W, R)),
    Case("DESCRIBE", sql("DESCRIBE {db}.{t}"), (*TABLE_LEVEL, OK, OK, OK)),
    Case("SHOW PARTITIONS", sql("SHOW PARTITIONS {db}.{t}"), (*TABLE_LEVEL, OK, OK, OK)),
    Case("SHOW GRANTS ON", sql("SHOW GRANTS ON TABLE {db}.{t}"), (*TABLE_LEVEL, OK, OK, OK)),
    Case("EXPLAIN", sql("EXPLAIN SELECT v FROM {db}.{t}"), (*TABLE_LEVEL, OK, OK, OK)),
    Case("DROP TABLE", sql("DROP TABLE {db}.{t}"), (*TABLE_LEVEL, *[denied("DROP")] * 3)),
    Case("DROP TABLE IF EXISTS", sql("DROP TABLE IF EXISTS {db}.{t}"), (*TABLE_LEVEL, *[denied("DROP")] * 3)),
    Case("ALTER TABLE", sql("ALTER TABLE {db}.{t} ADD COLUMN extra STRING"), (*TABLE_LEVEL, *[denied("ALTER")] * 3)),
    Case("GRANT", sql("GRANT READ ON TABLE {db}.{t} TO stranger"), (*TABLE_LEVEL, *[denied("ALL")] * 3)),
    Case("REVOKE", sql("REVOKE READ ON TABLE {db}.{t} FROM reader"), (*TABLE_LEVEL, *[denied("ALL")] * 3)),
    # database-level verbs: the stranger sees no shop; the others do
    Case("SHOW TABLES IN", sql("SHOW TABLES IN {db}"), (ABSENT, OK, OK, OK, OK)),
    Case("USE", sql("USE {db}"), (ABSENT, OK, OK, OK, OK)),
    Case("CREATE TABLE", sql("CREATE TABLE {db}.fresh (id BIGINT)"),
         (ABSENT, *[denied("CREATE", "database {db}")] * 4)),
    Case("DROP DATABASE", sql("DROP DATABASE {db} CASCADE"), (ABSENT, *[denied("DROP", "database {db}")] * 4)),
    Case("CREATE DATABASE", sql("CREATE DATABASE fresh"), tuple([denied("CREATE", "cluster")] * 5)),
    # Flight SQL RPCs
    Case("Flight SQL query", flight_sql_query, (*TABLE_LEVEL, R, OK, R)),
    Case("Flight SQL update", flight_sql_update, (*TABLE_LEVEL, W, W, OK)),
    Case("ADBC prepared query", adbc("SELECT v FROM {db}.{t} WHERE id = ? AND region = 'eu'", (1,)),
         (*TABLE_LEVEL, R, OK, R)),
    Case("ADBC prepared update", adbc_many("INSERT INTO {db}.{t} VALUES (?, 'eu', 4, ?)", [(4, "a"), (5, "b")]),
         (*TABLE_LEVEL, W, W, OK)),
    Case("ADBC ingest", ingest, (*TABLE_LEVEL, W, W, OK)),
    Case("GetPrimaryKeys", primary_keys, (*TABLE_LEVEL, OK, OK, OK)),
    Case("GetTables", get_tables, (ABSENT, OK, OK, OK, OK)),
    Case("GetDbSchemas", get_db_schemas, (ABSENT, OK, OK, OK, OK)),
    Case("SetSessionOptions schema", session_schema, (ABSENT, OK, OK, OK, OK)),
    # flightstore's own commands
    Case("lookup", table_call(lambda t: t.lookup({"id": [1], "region": ["eu"]}).to_pylist()), (*TABLE_LEVEL, R, OK, R)),
    Case("scan", table_call(lambda t: t.scan().num_rows), (*TABLE_LEVEL, R, OK, R)),
    Case("count", table_call(lambda t: t.row_count()), (*TABLE_LEVEL, R, OK, R)),
    Case("subscribe", table_call(first_batch), (*TABLE_LEVEL, R, OK, R)),
    Case("prefix lookup", table_call(lambda t: t.prefix_lookup({"id": [1], "region": ["eu"]}).num_rows),
         (*TABLE_LEVEL, R, OK, R)),
    Case("changelog", table_call(changelog), (*TABLE_LEVEL, R, OK, R)),
    Case("read snapshot", table_call(read_snapshot), (*TABLE_LEVEL, R, OK, R)),
    Case("lake-split", table_call(action("flightstore.lake-split", "union")), (*TABLE_LEVEL, R, OK, R)),
    Case("locations", table_call(action("flightstore.locations", "num_buckets")), (*TABLE_LEVEL, OK, OK, OK)),
    Case("upsert", table_call(lambda t: t.upsert({"id": [6], "region": ["eu"], "ssn": [6], "v": ["u"]})["rows"]),
         (*TABLE_LEVEL, W, W, OK)),
    Case("delete", table_call(lambda t: t.delete({"id": [99], "region": ["eu"]})["rows"]), (*TABLE_LEVEL, W, W, OK)),
    Case("offsets", table_call(lambda t: sorted(t.offsets())), (*TABLE_LEVEL, OK, OK, OK)),
    Case("buckets", table_call(lambda t: t.buckets()), (*TABLE_LEVEL, OK, OK, OK)),
    Case("usage", table_call(lambda t: sorted(t.usage())), (*TABLE_LEVEL, OK, OK, OK)),
    Case("describe", table_call(lambda t: sorted(t.describe())), (*TABLE_LEVEL, OK, OK, OK)),
    Case("writer", table_call(lambda t: t._next_sequence()), (*TABLE_LEVEL, W, W, OK)),
    Case("undo", table_call(lambda t: t.undo(0)), (*TABLE_LEVEL, W, W, OK)),
    Case("release", table_call(lambda t: t.release()), (*TABLE_LEVEL, W, W, OK)),
    Case("snapshot", table_call(lambda t: t.snapshot()), (*TABLE_LEVEL, *[denied("ALTER")] * 3)),
]


def _answer(call: Callable[[], object]) -> tuple[str, str]:
    """(kind, message) of a call: "ok" and what it returned, or the error's type and message
    (without the gRPC debug context, which names the connection)."""
    try:
        return "ok", repr(call())
    except (flight.FlightError, pa.ArrowException, adbc_driver_manager.Error, InvalidOption) as exc:
        message = str(exc).split("gRPC client debug context")[0]
        return type(exc).__name__, message


def _normal(answer: tuple[str, str], db: str, table: str) -> tuple[str, str]:
    return answer[0], answer[1].replace(db, "<db>").replace(table, "<table>")


def _status(answer: tuple[str, str]) -> str:
    kind, message = answer
    if kind == "ok":
        return OK
    if kind == "FlightUnauthorizedError" or message.startswith("UNAUTHORIZED"):
        return "denied"
    if kind == "ArrowInvalid" or message.startswith("INVALID_ARGUMENT"):
        return INVALID
    return kind


PARAMS = [(case, level, expected) for case in CASES for level, expected in zip(LEVELS, case.expected)]


@pytest.mark.parametrize("case, user, expected", PARAMS,
                         ids=[f"{case.name}-{level}" for case, level, _ in PARAMS])
def test_privilege_matrix(env, case, user, expected):
    seen = _answer(lambda: case.call(env, user, "shop", "secret"))
    if expected == ABSENT:
        absent_db, absent_table = ("nodb", "secret") if user == "stranger" else ("shop", "nosuch")
        absent = _answer(lambda: case.call(env, user, absent_db, absent_table))
        assert _normal(seen, "shop", "secret") == _normal(absent, absent_db, absent_table), (seen, absent)
        assert "ssn" not in seen[1] and "region" not in seen[1], seen  # nothing of the hidden table
        return
    if isinstance(expected, tuple):  # denied, naming the user, the operation and the resource
        operation = expected[1].format(db="shop", t="secret")
        assert _status(seen) == "denied", seen
        assert f"user {user!r} may not {operation}" in seen[1], seen
        return
    assert _status(seen) == expected, seen


def test_the_absent_answers_are_not_found(env):
    """Hidden or absent, a table in a query is NOT_FOUND (not a refusal that confirms it)."""
    for user, db in (("stranger", "shop"), ("neighbour", "shop")):
        with pytest.raises(pa.ArrowKeyError, match="does not exist"):
            env.client(user).sql(f"SELECT v FROM {db}.secret")


def test_listings_and_use_agree(env):
    """A database is listed to a user exactly when USE and SetSessionOptions accept it."""
    for user in LEVELS:
        conn = env.client(user)
        listed = "shop" in conn.sql("SHOW DATABASES").column(0).to_pylist()
        for switch in (lambda: conn.sql("USE shop"), lambda: conn.set_session_options({"schema": "shop"})):
            accepted = _answer(switch)[0] == "ok"
            assert accepted == listed, (user, listed)
        assert listed == (user != "stranger")
