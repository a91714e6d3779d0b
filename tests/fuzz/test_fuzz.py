"""Fuzzing the server through its public protocol (issue 10, "a fuzz suite in the repo").

Two generators run against one real server:

* SQL statements mutated from a small corpus (tokens dropped, repeated, swapped, or replaced by
  keywords, punctuation, odd literals and hostile names), sent as Flight SQL queries and updates;
* malformed Flight traffic: random bytes as commands, tickets and action bodies, Any-wrapped
  Flight SQL messages with random contents, and flightstore's own JSON commands with random
  fields, on GetFlightInfo, DoGet, DoPut and DoAction.

Invariants after every call: it answered a result or a clean Flight error (INVALID_ARGUMENT,
NOT_FOUND, UNIMPLEMENTED, ... never INTERNAL/UNKNOWN, never a traceback, a Python exception class
name or the server's data directory), refused input changed nothing (catalog version, tables,
row counts and log offsets), and the server still answers a query.

``make test`` runs a short deterministic pass (hypothesis ``derandomize``; a few seconds each);
``make fuzz`` sets ``FLIGHTSTORE_FUZZ_EXAMPLES`` for a long randomized run.
"""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyarrow import flight

import flightstore
from flightstore.server import protocol, tickets
from tests.server.conftest import RunningServer

LONG_RUN = int(os.environ.get("FLIGHTSTORE_FUZZ_EXAMPLES", "0"))


def fuzz_settings(short_examples: int) -> settings:
    if LONG_RUN:
        return settings(max_examples=LONG_RUN, deadline=None, derandomize=False,
                        suppress_health_check=list(HealthCheck))
    return settings(max_examples=short_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


CLEAN = (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowNotImplementedError, flight.FlightCancelledError,
         flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError)
LEAKS = re.compile(r"Traceback|\b(KeyError|IndexError|TypeError|AttributeError|ValueError|RecursionError|"
                   r"ZeroDivisionError|OverflowError|AssertionError|UnicodeDecodeError|OSError)\b|"
                   r"\.py\"|site-packages|internal error")
CALL = flight.FlightCallOptions(timeout=60)  # a hang fails the example instead of the suite
BASE_TABLES = {
    "t": "CREATE TABLE IF NOT EXISTS t (id BIGINT, name STRING, score DOUBLE, "
         "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')",
    "lg": "CREATE TABLE IF NOT EXISTS lg (id BIGINT, name STRING)",
}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    # Small DDL limits: a mutated WITH clause must not ask for thousands of buckets.
    server = RunningServer(tmp_path_factory.mktemp("fuzz") / "data",
                           options={"max.bucket.num": 16, "max.partition.num": 8})
    client = flight.FlightClient(server.uri)
    _ensure_base(server)
    yield server, client
    client.close()
    server.stop()


def _ensure_base(server) -> None:
    """The base tables exist with rows (a fuzzed DROP or DELETE may have removed them)."""
    with flightstore.connect(server.uri) as conn:
        for name, ddl in BASE_TABLES.items():
            conn.sql(ddl)
            if server.store.table(name).row_count() == 0:
                conn.execute(f"INSERT INTO {name} (id, name) VALUES (1, 'a'), (2, 'b'), (3, NULL)")


def _state(server) -> tuple:
    store = server.store
    tables = {}
    for path in store.catalog.all_tables():
        try:
            table = store.table(path)
            tables[str(path)] = (table.row_count(), dict(table.end_offsets()))
        except flightstore.errors.FlightstoreError as exc:  # a table the fuzzer broke on purpose
            tables[str(path)] = type(exc).__name__
    return store.catalog.version, tables


def _check(server, client, call) -> None:
    """Run ``call``: a result or a clean error; refused input changed nothing; the server serves."""
    before = _state(server)
    try:
        call()
    except CLEAN as exc:
        message = str(exc)
        assert not LEAKS.search(message), message
        assert str(server.store.data_dir) not in message, message
        assert _state(server) == before, message
    except flight.FlightTimedOutError:
        pytest.fail("a fuzzed call hung")
    # any other error (INTERNAL, UNKNOWN, a Python error in the client) fails the example as is
    _ensure_base(server)
    _sql_query(client, "USE default")  # a fuzzed USE moved this connection's session
    command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT COUNT(*) AS n FROM default.lg"))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command), CALL)
    assert client.do_get(info.endpoints[0].ticket, CALL).read_all().num_rows == 1


# ---- SQL: a corpus, mutated ----------------------------------------------------------------------
CORPUS = [
    "SELECT * FROM t",
    "SELECT id, name FROM t WHERE id = 1",
    "SELECT name, COUNT(*) AS n FROM lg GROUP BY name ORDER BY n DESC LIMIT 2",
    "SELECT t.id, lg.name FROM t JOIN lg ON t.id = lg.id WHERE t.score IS NULL",
    "SELECT * FROM t WHERE id IN (1, 2, 3) AND name LIKE 'a%'",
    "SELECT id FROM (SELECT id FROM lg WHERE id > 1) s",
    "SELECT * FROM t$changelog",
    "INSERT INTO t VALUES (10, 'x', 1.5)",
    "INSERT INTO lg (id, name) VALUES (11, 'y'), (12, NULL)",
    "UPDATE t SET score = 2.0 WHERE id = 1",
    "DELETE FROM t WHERE id = 10",
    "CREATE TABLE f1 (id BIGINT, v STRING) WITH ('bucket.num' = '2')",
    "CREATE TABLE f2 (k INT, v DOUBLE, PRIMARY KEY (k) NOT ENFORCED)",
    "CREATE DATABASE fdb",
    "ALTER TABLE lg ADD COLUMN note STRING",
    "ALTER TABLE f1 RENAME TO f3",
    "DROP TABLE IF EXISTS f2",
    "SHOW TABLES",
    "DESCRIBE t",
    "USE fdb",
]
VOCABULARY = ["SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "NULL", "(", ")", ",", ".", "*", "=", "<",
              ";", "--", "'", '"', "`", "$", "?", "JOIN", "ON", "GROUP BY", "ORDER BY", "LIMIT", "IN",
              "CREATE", "TABLE", "DROP", "DATABASE", "INSERT", "INTO", "VALUES", "ALTER", "RENAME",
              "TO", "PRIMARY KEY", "WITH", "CAST", "AS", "BIGINT", "STRING", "DECIMAL(38, 2)", "t",
              "lg", "nope", "t$changelog", "t$partitions", '"../../pwn"', '".."', '""', "x" * 300,
              "0", "1", "-1", "7", "1e308", "99999999999999999999", "'x'", "''", "'é'",
              "'2024-01-01'", "X'00'", "TRUE", "read_csv('/etc/passwd')", "'../../etc/passwd'",
              "'bucket.num'", "'table.log.ttl'", "\x00", "\t", "é"]


def _tokens(sql: str) -> list[str]:
    return re.findall(r"'[^']*'|\w+\$?\w*|[^\s\w]", sql)


@st.composite
def mutated_sql(draw) -> str:
    tokens = _tokens(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, len(tokens)))
        kind = draw(st.sampled_from(["drop", "repeat", "swap", "insert", "replace"]))
        if kind == "insert" or not tokens:
            tokens.insert(where, draw(st.sampled_from(VOCABULARY)))
            continue
        where = min(where, len(tokens) - 1)
        if kind == "drop":
            del tokens[where]
        elif kind == "repeat":
            tokens.insert(where, tokens[where])
        elif kind == "swap":
            other = draw(st.integers(0, len(tokens) - 1))
            tokens[where], tokens[other] = tokens[other], tokens[where]
        else:
            tokens[where] = draw(st.sampled_from(VOCABULARY))
    return " ".join(tokens)


def _sql_query(client, sql: str) -> None:
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command), CALL)
    for endpoint in info.endpoints:
        client.do_get(endpoint.ticket, CALL).read_all()


def _sql_update(client, sql: str) -> None:
    command = protocol.pack_any(protocol.CommandStatementUpdate(query=sql))
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(command), pa.schema([]), CALL)
    writer.done_writing()
    reader.read()
    writer.close()


@fuzz_settings(short_examples=40)
@given(sql=mutated_sql(), as_update=st.booleans())
def test_mutated_sql(fuzzed, sql, as_update) -> None:
    server, client = fuzzed
    _check(server, client, lambda: (_sql_update if as_update else _sql_query)(client, sql))


# ---- malformed Flight traffic ----------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4),
                    max_leaves=12)
OPS = ["scan", "lookup", "prefix_lookup", "count", "snapshot", "changelog", "result", "append", "upsert",
       "delete", "write", "explode"]  # not "subscribe": a valid one streams until its end offsets
FIELDS = sorted(set(tickets.FIELD_TYPES) - {"op"})
TABLE_NAMES = st.sampled_from(["t", "lg", "default.t", "nope", "", "..", "../../pwn", "a/b", "x" * 5000])


@st.composite
def custom_payload(draw) -> bytes:
    payload = {"op": draw(st.sampled_from(OPS))}
    if draw(st.booleans()):
        payload["table"] = draw(TABLE_NAMES)
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        payload[key] = draw(JSON)
    return tickets.encode_custom(payload)


SQL_MESSAGES = ["CommandStatementQuery", "CommandStatementUpdate", "CommandStatementIngest",
                "CommandPreparedStatementQuery", "CommandGetTables", "CommandGetPrimaryKeys",
                "CommandGetDbSchemas", "TicketStatementQuery", "CommandGetSqlInfo", "CommandGetXdbcTypeInfo"]


@st.composite
def flight_command(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "any", "custom"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "custom":
        return draw(custom_payload())
    from google.protobuf import any_pb2
    name = draw(st.sampled_from(SQL_MESSAGES))
    return any_pb2.Any(type_url=protocol.TYPE_URL_PREFIX + protocol.SQL_PACKAGE + "." + name,
                       value=draw(st.binary(max_size=48))).SerializeToString()


ACTIONS = [protocol.CREATE_PREPARED_STATEMENT, protocol.CLOSE_PREPARED_STATEMENT, protocol.CANCEL_FLIGHT_INFO,
           protocol.SET_SESSION_OPTIONS, protocol.GET_SESSION_OPTIONS, protocol.BEGIN_TRANSACTION,
           "flightstore.offsets", "flightstore.buckets", "flightstore.undo", "flightstore.release",
           "flightstore.snapshot", "flightstore.usage", "flightstore.writer", "flightstore.lake-status",
           "flightstore.cluster", "MadeUp"]


def _put(client, command: bytes) -> None:
    data = pa.table({"id": pa.array([100], pa.int64()), "name": ["fz"]})
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(command), data.schema, CALL)
    writer.write_table(data)
    writer.done_writing()
    reader.read()
    writer.close()


@fuzz_settings(short_examples=120)
@given(rpc=st.sampled_from(["info", "get", "put", "action"]), command=flight_command(),
       action_type=st.sampled_from(ACTIONS))
def test_malformed_flight_calls(fuzzed, rpc, command, action_type) -> None:
    server, client = fuzzed
    def call():
        if rpc == "info":
            return client.get_flight_info(flight.FlightDescriptor.for_command(command), CALL)
        if rpc == "get":
            return client.do_get(flight.Ticket(command), CALL).read_all()
        if rpc == "put":
            return _put(client, command)
        return list(client.do_action(flight.Action(action_type, command), CALL))
    _check(server, client, call)


def test_the_fuzzers_reach_the_server(fuzzed) -> None:
    """Guard against a fuzzer that only ever meets the same early refusal: known-good inputs from
    the generators' building blocks are accepted."""
    _, client = fuzzed
    _sql_query(client, CORPUS[2])
    with pytest.raises(pa.ArrowInvalid, match="table name"):
        client.get_flight_info(flight.FlightDescriptor.for_command(
            tickets.encode_custom({"op": "scan", "table": "../../pwn"})), CALL)
    assert json.loads(tickets.encode_custom({"op": "scan"})[len(tickets.CUSTOM_PREFIX):]) == {"op": "scan"}
