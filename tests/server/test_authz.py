"""Authorization in Fluss's model over every kind of RPC: a user who may only describe is refused
(naming user, operation and resource) and nothing changes or leaks; grants allow; grants survive
restarts; REVOKE takes them back; metadata lists only what the user may describe. (What a user
without any grant sees, object by object and RPC by RPC: tests/server/test_privilege_matrix.py.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

import adbc_driver_manager
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.server import protocol, tickets
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

USERS = {"admin": "adm1n", "alice": "al1ce", "bob": "b0b"}
TIMEOUT = 60


class AclServer:
    """A server with users and authorization on one data directory; restartable."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        self._start()

    def _start(self) -> None:
        self.store = Store(self.data_dir)
        self.server = FlightSqlServer(self.store, users=USERS, super_users=("admin",))
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()

    def restart(self) -> None:
        self.stop()
        self._start()

    def connect(self, user: str) -> flightstore.Connection:
        return flightstore.connect(self.uri, username=user, password=USERS[user], timeout=TIMEOUT)

    @contextmanager
    def adbc(self, user: str):
        with dbapi.connect(self.uri, db_kwargs={"username": user, "password": USERS[user]},
                           autocommit=True) as conn, conn.cursor() as cur:
            yield cur

    def admin_sql(self, sql: str) -> pa.Table:
        with self.connect("admin") as conn:
            return conn.sql(sql)


@pytest.fixture
def env(tmp_path):
    running = AclServer(tmp_path / "data")
    with running.connect("admin") as admin:
        admin.sql("CREATE DATABASE shop")
        admin.sql("CREATE TABLE shop.pk (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        admin.sql("CREATE TABLE shop.lg (id BIGINT, v STRING)")
        admin.sql("CREATE TABLE shop.secret (id BIGINT, v STRING)")
        admin.table("shop.pk").upsert({"id": [1, 2], "v": ["a", "b"]})
        admin.table("shop.lg").append({"id": [10], "v": ["x"]})
        admin.table("shop.secret").append({"id": [99], "v": ["classified"]})
    yield running
    running.stop()


def _state(env: AclServer) -> dict:
    """Everything a refused call must leave alone, read by the super user."""
    with env.connect("admin") as admin:
        tables = admin.sql("SHOW TABLES IN shop").column(0).to_pylist()
        return {
            "databases": admin.sql("SHOW DATABASES").column(0).to_pylist(),
            "tables": tables,
            "rows": {t: admin.sql(f"SELECT * FROM shop.{t} ORDER BY id").to_pylist() for t in tables},
            "offsets": {t: admin.table(f"shop.{t}").offsets() for t in tables},
            "grants": admin.sql("SHOW GRANTS").to_pylist(),
        }


def _expect_denied(call: Callable[[], object], user: str, operation: str, resource: str) -> None:
    try:
        call()
    except flight.FlightUnauthorizedError as exc:
        message = str(exc)
    except adbc_driver_manager.Error as exc:
        message = str(exc)
        assert message.startswith("UNAUTHORIZED"), message
    else:
        raise AssertionError(f"{user} was allowed {operation} on {resource}")
    assert f"user {user!r} may not {operation} {resource}" in message, message


# ---- what bob tries: (name, call, operation and resource named when denied) ----------------------
def _adbc(sql: str, params=None):
    def run(env: AclServer, user: str) -> None:
        with env.adbc(user) as cur:
            cur.execute(sql, params)
            cur.fetchall()
    return run


def _adbc_many(sql: str, rows):
    def run(env: AclServer, user: str) -> None:
        with env.adbc(user) as cur:
            cur.executemany(sql, rows)
    return run


def _ingest(table: str, mode: str):
    def run(env: AclServer, user: str) -> None:
        with env.adbc(user) as cur:
            cur.adbc_ingest(table, pa.table({"id": pa.array([5], pa.int64()), "v": ["i"]}), mode=mode,
                            db_schema_name="shop")
    return run


def _client(action: Callable[[flightstore.Connection], object]):
    def run(env: AclServer, user: str) -> None:
        with env.connect(user) as conn:
            action(conn)
    return run


def _first_batch(conn: flightstore.Connection) -> None:
    with conn.table("shop.pk").subscribe("earliest") as subscription:
        next(iter(subscription))


def _update(sql: str):
    return _client(lambda conn: conn.execute(sql))


CASES = [
    ("adbc point lookup", _adbc("SELECT * FROM shop.pk WHERE id = ?", (1,)), "READ", "table shop.pk"),
    ("adbc scan", _adbc("SELECT v FROM shop.lg"), "READ", "table shop.lg"),
    ("adbc residual join", _adbc("SELECT p.v FROM shop.lg l JOIN shop.pk p ON l.id = p.id"), "READ", "table shop.lg"),
    ("adbc count", _adbc("SELECT COUNT(*) FROM shop.lg"), "READ", "table shop.lg"),
    ("adbc changelog", _adbc("SELECT * FROM `shop`.`pk$changelog`"), "READ", "table shop.pk"),
    ("adbc insert", _adbc("INSERT INTO shop.lg VALUES (3, 'c')"), "WRITE", "table shop.lg"),
    ("adbc insert select", _adbc("INSERT INTO shop.lg SELECT id, v FROM shop.pk"), "WRITE", "table shop.lg"),
    ("adbc executemany", _adbc_many("INSERT INTO shop.pk VALUES (?, ?)", [(7, "g"), (8, "h")]), "WRITE",
     "table shop.pk"),
    ("adbc delete", _adbc("DELETE FROM shop.pk WHERE id = 1"), "WRITE", "table shop.pk"),
    ("adbc update", _adbc("UPDATE shop.pk SET v = 'z' WHERE id = 2"), "WRITE", "table shop.pk"),
    ("adbc create table", _adbc("CREATE TABLE shop.new (id BIGINT)"), "CREATE", "database shop"),
    ("adbc drop table", _adbc("DROP TABLE shop.lg"), "DROP", "table shop.lg"),
    ("adbc create database", _adbc("CREATE DATABASE other"), "CREATE", "cluster"),
    ("adbc drop database", _adbc("DROP DATABASE shop CASCADE"), "DROP", "database shop"),
    ("adbc describe", _adbc("DESCRIBE shop.pk"), "DESCRIBE", "table shop.pk"),
    ("adbc use", _adbc("USE shop"), "DESCRIBE", "database shop"),
    ("adbc grant", _adbc("GRANT READ ON shop.pk TO bob"), "ALL", "table shop.pk"),
    ("flight sql update", _update("INSERT INTO shop.lg VALUES (4, 'd')"), "WRITE", "table shop.lg"),
    ("ingest append", _ingest("lg", "append"), "WRITE", "table shop.lg"),
    ("ingest create", _ingest("fresh", "create"), "WRITE", "table shop.fresh"),
    ("client sql lookup", _client(lambda c: c.sql("SELECT * FROM shop.pk WHERE id = 1")), "READ", "table shop.pk"),
    ("client sql scan", _client(lambda c: c.sql("SELECT * FROM shop.lg")), "READ", "table shop.lg"),
    ("client sql insert", _client(lambda c: c.sql("INSERT INTO shop.lg VALUES (5, 'e')")), "WRITE", "table shop.lg"),
    ("client lookup", _client(lambda c: c.table("shop.pk").lookup({"id": [1]})), "READ", "table shop.pk"),
    ("client scan", _client(lambda c: c.table("shop.lg").scan()), "READ", "table shop.lg"),
    ("client count", _client(lambda c: c.table("shop.lg").row_count()), "READ", "table shop.lg"),
    ("client upsert", _client(lambda c: c.table("shop.pk").upsert({"id": [9], "v": ["n"]})), "WRITE", "table shop.pk"),
    ("client append", _client(lambda c: c.table("shop.lg").append({"id": [9], "v": ["n"]})), "WRITE", "table shop.lg"),
    ("client subscribe", _client(_first_batch), "READ", "table shop.pk"),
    ("action offsets", _client(lambda c: c.table("shop.pk").offsets()), "DESCRIBE", "table shop.pk"),
    ("action undo", _client(lambda c: c.table("shop.pk", writer_id="w").undo(0)), "WRITE", "table shop.pk"),
    ("action release", _client(lambda c: c.table("shop.pk", writer_id="w").release()), "WRITE", "table shop.pk"),
]


# What DESCRIBE allows (USE needs only to see the database) is not refused.
DENIED = [case for case in CASES if case[0] not in ("adbc use", "adbc describe", "action offsets")]


@pytest.mark.parametrize("name, call, operation, resource", DENIED, ids=[c[0] for c in DENIED])
def test_user_who_may_only_describe_is_refused_and_nothing_changes(env, name, call, operation, resource):
    env.admin_sql("GRANT DESCRIBE ON DATABASE shop TO bob")  # without it, shop does not exist for bob
    before = _state(env)
    _expect_denied(lambda: call(env, "bob"), "bob", operation, resource)
    assert _state(env) == before
    call(env, "admin")  # the same call is fine for a super user


def _visible(env: AclServer, user: str) -> dict:
    """What the metadata RPCs show ``user``."""
    with env.adbc(user) as cur:
        objects = cur.connection.adbc_get_objects(depth="tables").read_all().to_pylist()
        cur.execute("SHOW DATABASES")
        databases = [row[0] for row in cur.fetchall()]
        try:
            cur.execute("SHOW TABLES IN shop")
            tables = [row[0] for row in cur.fetchall()]
        except adbc_driver_manager.ProgrammingError as exc:  # a database it does not see is absent
            assert "NOT_FOUND" in str(exc) and "database 'shop' does not exist" in str(exc)
            tables = None
        cur.execute("SHOW GRANTS")
        grants = cur.fetchall()
    listed = {schema["db_schema_name"]: sorted(t["table_name"] for t in schema["db_schema_tables"] or [])
              for catalog in objects for schema in catalog["catalog_db_schemas"] or []}
    with env.connect(user) as conn:
        command = protocol.CommandGetPrimaryKeys(table="pk", db_schema="shop")
        info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(protocol.pack_any(command)),
                                            conn._options)
        keys = conn.read_info(info).column("column_name").to_pylist()
    return {"objects": listed, "databases": databases, "tables": tables, "grants": grants, "pk_keys": keys}


def test_metadata_lists_only_what_the_user_may_describe(env):
    seen = _visible(env, "bob")
    assert seen == {"objects": {}, "databases": [], "tables": None, "grants": [], "pk_keys": []}
    env.admin_sql("GRANT READ ON TABLE shop.pk TO bob")
    env.admin_sql("GRANT WRITE ON TABLE shop.secret TO alice")
    seen = _visible(env, "bob")
    assert seen["objects"] == {"shop": ["pk"]}
    assert seen["databases"] == ["shop"] and seen["tables"] == ["pk"] and seen["pk_keys"] == ["id"]
    assert seen["grants"] == [("bob", "TABLE", "shop.pk", "READ")]  # not alice's grant on shop.secret
    everything = _visible(env, "admin")
    assert everything["objects"] == {"default": [], "shop": ["lg", "pk", "secret"]}
    assert len(everything["grants"]) == 2


def test_a_ticket_is_checked_for_whoever_presents_it(env):
    with env.connect("admin") as admin:
        command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT * FROM shop.secret"))
        info = admin._client.get_flight_info(flight.FlightDescriptor.for_command(command), admin._options)
    with env.connect("bob") as bob:
        # bob holds no grant: shop.secret does not exist for him
        with pytest.raises(pa.ArrowKeyError, match="table 'shop.secret' does not exist"):
            bob._client.do_get(info.endpoints[0].ticket, bob._options).read_all()
        env.admin_sql("GRANT DESCRIBE ON TABLE shop.secret TO bob")
        _expect_denied(lambda: bob._client.do_get(info.endpoints[0].ticket, bob._options).read_all(),
                       "bob", "READ", "table shop.secret")
        with env.connect("admin") as admin:
            kept = admin.sql("SELECT COUNT(*) AS n FROM shop.secret")
        assert kept.column("n").to_pylist() == [1]


def _allowed(env: AclServer, user: str, name: str) -> None:
    {c[0]: c[1] for c in CASES}[name](env, user)


def test_grants_allow_survive_restart_and_revoke_takes_them_back(env):
    env.admin_sql("GRANT READ ON TABLE shop.pk TO bob")
    env.admin_sql("GRANT WRITE, CREATE ON DATABASE shop TO bob")
    for name in ("adbc point lookup", "client lookup", "client subscribe", "action offsets", "adbc describe",
                 "adbc insert", "adbc executemany", "client upsert", "action undo", "action release",
                 "ingest append", "adbc create table", "ingest create", "flight sql update", "adbc use"):
        _allowed(env, "bob", name)
    # READ on shop.pk and WRITE on shop: joining shop.lg still needs READ on it; dropping needs DROP.
    for name, operation, resource in (("adbc residual join", "READ", "table shop.lg"),
                                      ("adbc drop table", "DROP", "table shop.lg"),
                                      ("adbc create database", "CREATE", "cluster"),
                                      ("adbc grant", "ALL", "table shop.pk")):
        _expect_denied(lambda name=name: _allowed(env, "bob", name), "bob", operation, resource)
    grants = env.admin_sql("SHOW GRANTS FOR bob").to_pylist()
    env.restart()
    assert env.admin_sql("SHOW GRANTS FOR bob").to_pylist() == grants
    _allowed(env, "bob", "client lookup")
    _allowed(env, "bob", "adbc insert")
    env.admin_sql("REVOKE READ ON TABLE shop.pk FROM bob")
    env.restart()
    _expect_denied(lambda: _allowed(env, "bob", "client lookup"), "bob", "READ", "table shop.pk")
    _allowed(env, "bob", "client upsert")  # WRITE on the database stays


def test_all_on_a_database_delegates_grants_within_it(env):
    env.admin_sql("GRANT ALL ON DATABASE shop TO alice")
    with env.connect("alice") as alice:
        alice.sql("GRANT READ ON TABLE shop.secret TO bob")
        _expect_denied(lambda: alice.sql("GRANT READ ON CLUSTER TO bob"), "alice", "ALL", "cluster")
        with pytest.raises(pa.ArrowKeyError, match="database 'default' does not exist"):
            alice.sql("GRANT READ ON DATABASE default TO bob")  # not one alice sees
        env.admin_sql("GRANT DESCRIBE ON DATABASE default TO alice")
        _expect_denied(lambda: alice.sql("GRANT READ ON DATABASE default TO bob"), "alice", "ALL",
                       "database default")
    with env.connect("bob") as bob:
        assert bob.sql("SELECT v FROM shop.secret").column("v").to_pylist() == ["classified"]


def test_without_authentication_everyone_may_do_everything(server):
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        conn.sql("CREATE DATABASE open")
        conn.sql("CREATE TABLE open.t (id BIGINT)")
        conn.sql("GRANT READ ON TABLE open.t TO nobody")
        conn.sql("REVOKE READ ON TABLE open.t FROM nobody")
        conn.sql("INSERT INTO open.t VALUES (1)")
        assert conn.sql("SHOW TABLES IN open").column(0).to_pylist() == ["t"]
        assert conn.sql("SELECT id FROM open.t").column("id").to_pylist() == [1]


def _do_get(conn: flightstore.Connection, ticket: bytes) -> tuple[str, str]:
    """What DoGet of ``ticket`` answers ``conn``: its rows, or the error's type and message."""
    try:
        return "ok", repr(conn._client.do_get(flight.Ticket(ticket), conn._options).read_all().to_pylist())
    except (flight.FlightError, pa.ArrowException) as exc:
        return type(exc).__name__, str(exc).split("gRPC client debug context")[0]


def test_a_result_ticket_is_served_only_to_the_user_it_was_issued_to(env):
    """A small result travels in its ticket; a larger (or a statement's) one is kept on the server.
    Either way, another user replaying the ticket (even one allowed to read the table, even a super
    user) gets what a ticket the server never issued gets."""
    env.admin_sql("GRANT READ, WRITE ON TABLE shop.pk TO alice")
    env.admin_sql("GRANT READ, WRITE ON TABLE shop.pk TO bob")
    with env.connect("alice") as alice, env.connect("bob") as bob, env.connect("admin") as admin:
        def info(sql: str) -> bytes:
            command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
            got = alice._client.get_flight_info(flight.FlightDescriptor.for_command(command), alice._options)
            return got.endpoints[0].ticket.ticket

        inline = info("SELECT v FROM shop.pk WHERE id = 1")  # answered at GetFlightInfo, in the ticket
        kept = info("INSERT INTO shop.pk VALUES (3, 'c')")     # a statement's row count, kept
        assert tickets.is_result(inline) and tickets.is_custom(kept)
        assert _do_get(alice, inline) == ("ok", "[{'v': 'a'}]")
        assert _do_get(alice, kept) == ("ok", "[{'rows_affected': 1}]")
        forged = inline[:len(tickets.RESULT_PREFIX)] + bytes(len(inline) - len(tickets.RESULT_PREFIX))
        never_issued = tickets.encode_custom({"op": "result", "id": "0" * 32})
        for other in (bob, admin):
            assert _do_get(other, inline) == _do_get(other, forged) == _do_get(other, b"not a ticket")
            assert _do_get(other, inline)[1].startswith(tickets.UNKNOWN_TICKET)
            assert _do_get(other, kept) == _do_get(other, never_issued)
            assert "expired or was already read" in _do_get(other, kept)[1]
        # A copy whose bytes were altered is unknown to its owner too.
        assert _do_get(alice, inline[:-1] + bytes([inline[-1] ^ 1]))[1].startswith(tickets.UNKNOWN_TICKET)


def test_a_prepared_statement_is_usable_only_by_the_user_who_prepared_it(env):
    env.admin_sql("GRANT READ ON TABLE shop.pk TO alice")
    env.admin_sql("GRANT READ ON TABLE shop.pk TO bob")
    with env.connect("alice") as alice, env.connect("bob") as bob:
        request = protocol.ActionCreatePreparedStatementRequest(query="SELECT v FROM shop.pk WHERE id = 1")
        [answer] = alice._client.do_action(
            flight.Action(protocol.CREATE_PREPARED_STATEMENT, protocol.pack_any(request)), alice._options)
        handle = protocol.unpack_any(answer.body.to_pybytes()).prepared_statement_handle

        def run(conn: flightstore.Connection, handle: bytes) -> tuple[str, str]:
            command = protocol.pack_any(protocol.CommandPreparedStatementQuery(prepared_statement_handle=handle))
            try:
                info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(command), conn._options)
                return "ok", repr(conn.read_info(info).to_pylist())
            except (flight.FlightError, pa.ArrowException) as exc:
                return type(exc).__name__, str(exc).split("gRPC client debug context")[0]

        def close(conn: flightstore.Connection) -> None:
            body = protocol.pack_any(protocol.ActionClosePreparedStatementRequest(prepared_statement_handle=handle))
            list(conn._client.do_action(flight.Action(protocol.CLOSE_PREPARED_STATEMENT, body), conn._options))

        assert run(alice, handle) == ("ok", "[{'v': 'a'}]")
        assert run(bob, handle) == run(bob, b"0" * len(handle))  # as a handle never issued
        assert "unknown or closed prepared statement" in run(bob, handle)[1]
        close(bob)  # closing another user's statement does nothing
        assert run(alice, handle) == ("ok", "[{'v': 'a'}]")
        close(alice)
        assert "unknown or closed prepared statement" in run(alice, handle)[1]
