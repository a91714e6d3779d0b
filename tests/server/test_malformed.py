"""Malformed client payloads on every RPC kind get a clean Flight error (defect 10 of issue 10).

Each case is sent raw with pyarrow.flight: its status class, words of its message, and that no
Python traceback, exception class name or server path comes back; after each one nothing was
written and the server still answers. ADBC sees the same (a query on a table whose files vanished
names the table, not the server's directories).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.catalog import read_table_dir
from flightstore.server import protocol, tickets
from flightstore.server.service import _translate
from flightstore.store import Store
from tests.server.conftest import RunningServer

INVALID, NOT_FOUND, UNIMPLEMENTED = pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowNotImplementedError
LEAKS = re.compile(r"Traceback|\b(KeyError|IndexError|TypeError|AttributeError|ValueError|RecursionError|"
                   r"ArrowInvalid|ArrowKeyError)\b|\.py\"|site-packages")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    server = RunningServer(tmp_path_factory.mktemp("malformed") / "data")
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        conn.sql("CREATE TABLE lg (id BIGINT, v STRING)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        conn.execute("INSERT INTO lg VALUES (1, 'a')")
    client = flight.FlightClient(server.uri)
    yield server, client
    client.close()
    server.stop()


def _state(server) -> tuple:
    store = server.store
    return (store.catalog.version, {name: dict(store.table(name).end_offsets()) for name in ("t", "lg")})


def _still_serves(client: flight.FlightClient) -> None:
    command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT COUNT(*) AS n FROM t"))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"n": 2}]


# ---- how each RPC kind is sent ----------------------------------------------------------------
def info(command: bytes):
    return lambda c: c.get_flight_info(flight.FlightDescriptor.for_command(command))


def get(ticket: bytes):
    return lambda c: c.do_get(flight.Ticket(ticket)).read_all()


def put(command: bytes | None, data: pa.Table | None = None):
    data = data if data is not None else pa.table({"id": pa.array([9], pa.int64()), "v": ["z"]})

    def call(c):
        descriptor = (flight.FlightDescriptor.for_path("t") if command is None
                      else flight.FlightDescriptor.for_command(command))
        writer, reader = c.do_put(descriptor, data.schema)
        writer.write_table(data)
        writer.done_writing()
        reader.read()
        writer.close()
    return call


def action(kind: str, body: bytes):
    return lambda c: list(c.do_action(flight.Action(kind, body)))


def custom(**payload) -> bytes:
    return tickets.encode_custom(payload)


def query_ticket(handle: dict | bytes) -> bytes:
    raw = handle if isinstance(handle, bytes) else json.dumps(handle).encode()
    return protocol.pack_any(protocol.TicketStatementQuery(statement_handle=raw))


def sql(text: str):
    return info(protocol.pack_any(protocol.CommandStatementQuery(query=text)))


def typed_any(name: str, value: bytes) -> bytes:
    from google.protobuf import any_pb2
    return any_pb2.Any(type_url=protocol.TYPE_URL_PREFIX + protocol.SQL_PACKAGE + "." + name,
                       value=value).SerializeToString()


NESTED_FROM = "SELECT * FROM " + "(SELECT * FROM " * 50 + "t" + ") s" * 50
NESTED_PARENS = "SELECT " + "(" * 600 + "1" + ")" * 600

# (id, call, status, words the first line of the message must hold)
CASES = [
    # GetFlightInfo
    ("info: path descriptor", lambda c: c.get_flight_info(flight.FlightDescriptor.for_path("t")),
     INVALID, ["command descriptors"]),
    ("info: garbage bytes", info(b"\xff\xfe garbage"), INVALID, ["malformed"]),
    ("info: Any of a query with a garbage value", info(typed_any("CommandStatementQuery", b"\xff\xff\xff")),
     INVALID, ["malformed"]),
    ("info: unknown Any type", info(typed_any("CommandMadeUp", b"")), UNIMPLEMENTED, ["CommandMadeUp"]),
    ("info: unknown prepared handle", info(protocol.pack_any(
        protocol.CommandPreparedStatementQuery(prepared_statement_handle=b"nope"))), INVALID, ["prepared"]),
    ("info: custom not json", info(tickets.CUSTOM_PREFIX + b"{nope"), INVALID, ["malformed"]),
    ("info: custom json list", info(tickets.CUSTOM_PREFIX + b"[1, 2]"), INVALID, ["no 'op'"]),
    ("info: custom without table", info(custom(op="scan")), INVALID, ["'table'"]),
    ("info: custom table of wrong type", info(custom(op="scan", table=5)), INVALID, ["'table'", "str"]),
    ("info: custom columns not a list", info(custom(op="scan", table="t", columns="id")), INVALID, ["'columns'"]),
    ("info: custom deeply nested json", info(tickets.CUSTOM_PREFIX + b"[" * 100_000 + b"]" * 100_000),
     INVALID, ["malformed"]),
    ("info: custom unknown op", info(custom(op="explode", table="t")), INVALID, ["explode"]),
    ("info: custom unknown table", info(custom(op="scan", table="nope")), NOT_FOUND, ["nope"]),
    ("info: custom bad table name", info(custom(op="scan", table="../../x")), INVALID, ["table name"]),
    ("sql: 50 nested subqueries in FROM", sql(NESTED_FROM + " WHERE nope = 1"), INVALID, ["nope"]),
    ("sql: 600 nested parentheses", sql(NESTED_PARENS), INVALID, ["nested too deeply"]),
    ("sql: 50 nested function calls", sql("SELECT " + "abs(" * 50 + "1" + ")" * 50), INVALID,
     ["nested too deeply"]),
    # DoGet
    ("get: empty ticket", get(b""), INVALID, ["ticket"]),
    ("get: garbage ticket", get(b"\x00\x01garbage"), INVALID, [tickets.UNKNOWN_TICKET]),
    ("get: garbage result ticket", get(tickets.RESULT_PREFIX + b"12345678not arrow"), INVALID,
     [tickets.UNKNOWN_TICKET]),
    ("get: handle not json", get(query_ticket(b"{nope")), INVALID, ["statement handle"]),
    ("get: handle without sql", get(query_ticket({"db": "default"})), INVALID, ["statement handle"]),
    ("get: handle sql of wrong type", get(query_ticket({"sql": 5})), INVALID, ["statement handle"]),
    ("get: partition of wrong type", get(query_ticket({"sql": "SELECT * FROM t", "partition": "x"})),
     INVALID, ["'partition'"]),
    ("get: partition the query lacks", get(query_ticket({"sql": "SELECT * FROM t", "partition": 99})),
     INVALID, ["partition 99"]),
    ("get: params garbage", get(query_ticket({"sql": "SELECT * FROM t WHERE id = ?",
                                              "params": [{"$nope": 1}]})), INVALID, ["parameters"]),
    ("get: scan of a bucket the table lacks", get(custom(op="scan", table="t", buckets=[9])),
     INVALID, ["no bucket 9"]),
    ("get: scan of an unknown column", get(custom(op="scan", table="t", columns=["zz"])),
     INVALID, ["no column 'zz'"]),
    ("get: lookup keys not lists", get(custom(op="lookup", table="t", keys={"id": 1})), INVALID, ["'keys'"]),
    ("info: lookup keys null (found by make fuzz)", info(custom(op="lookup", table="t", keys=None)),
     INVALID, ["'keys'"]),
    ("get: prefix lookup without keys", get(custom(op="prefix_lookup", table="t")), INVALID, ["'keys'"]),
    ("get: lookup keys of the wrong type", get(custom(op="lookup", table="t", keys={"id": ["x"]})),
     INVALID, ["id"]),
    ("get: changelog of a bucket the table lacks", get(custom(op="changelog", table="t", bucket=9)),
     INVALID, ["no bucket 9"]),
    ("get: snapshot bucket as a string", get(custom(op="snapshot", table="t", bucket="0", at=0)),
     INVALID, ["'bucket'"]),
    ("get: subscribe from a bad position", get(custom(op="subscribe", table="t", start={"x": 1})),
     INVALID, ["'start'"]),
    ("get: malformed filter", get(custom(op="scan", table="t", filter={"op": "eq"})), INVALID, ["filter"]),
    ("get: kept result unknown", get(custom(op="result", id="nope")), INVALID, ["expired"]),
    # DoPut
    ("put: path descriptor", put(None), INVALID, ["command descriptors"]),
    ("put: garbage command", put(b"\xff\x00 nope"), INVALID, ["malformed"]),
    ("put: ingest with an empty table name", put(protocol.pack_any(protocol.CommandStatementIngest(
        table="", table_definition_options=protocol.CommandStatementIngest.TableDefinitionOptions(
            if_not_exist=1, if_exists=2)))), INVALID, ["table name", "empty"]),
    ("put: unknown prepared handle", put(protocol.pack_any(
        protocol.CommandPreparedStatementUpdate(prepared_statement_handle=b"zz"))), INVALID, ["prepared"]),
    ("put: custom sequence of wrong type", put(custom(op="upsert", table="t", writer_id="w", sequence="x")),
     INVALID, ["'sequence'"]),
    ("put: custom writer id of wrong type", put(custom(op="append", table="lg", writer_id=5)),
     INVALID, ["'writer_id'"]),
    ("put: custom columns of wrong type", put(custom(op="upsert", table="t", columns=[1])),
     INVALID, ["'columns'"]),
    ("put: custom unknown change type", put(custom(op="write", table="t"), pa.table({
        "id": pa.array([9], pa.int64()), "v": ["z"], "_change_type": ["ZZ"]})), INVALID, ["'ZZ'"]),
    ("put: custom unknown op", put(custom(op="explode", table="t")), INVALID, ["explode"]),
    ("put: custom without table", put(custom(op="append")), INVALID, ["'table'"]),
    # DoAction
    ("action: prepare with garbage", action(protocol.CREATE_PREPARED_STATEMENT, b"\xff\xff"), INVALID,
     ["malformed"]),
    ("action: prepare with the wrong message", action(protocol.CREATE_PREPARED_STATEMENT, protocol.pack_any(
        protocol.CommandGetTables())), INVALID, ["ActionCreatePreparedStatementRequest"]),
    ("action: close with garbage", action(protocol.CLOSE_PREPARED_STATEMENT, b"\x0a\xff"), INVALID,
     ["malformed"]),
    ("action: cancel with garbage", action(protocol.CANCEL_FLIGHT_INFO, b"\xff\xff"), INVALID, []),
    ("action: cancel a garbage FlightInfo", action(protocol.CANCEL_FLIGHT_INFO, protocol.CancelFlightInfoRequest(
        info=b"\x0a\x03abc").SerializeToString()), INVALID, ["FlightInfo"]),
    ("action: session options with garbage", action(protocol.SET_SESSION_OPTIONS, b"\xff\xff"), INVALID, []),
    ("action: flightstore body not json", action("flightstore.offsets", b"nope"), INVALID, ["malformed"]),
    ("action: offsets without table", action("flightstore.offsets", custom(op="offsets")), INVALID, ["'table'"]),
    ("action: offsets of an unknown kind", action("flightstore.offsets", custom(op="o", table="t", which="zz")),
     INVALID, ["zz"]),
    ("action: offsets at no timestamp", action("flightstore.offsets", custom(op="o", table="t", which="timestamp")),
     INVALID, ["'timestamp_ms'"]),
    ("action: undo with a string sequence", action("flightstore.undo", custom(
        op="undo", table="t", writer_id="w", after_sequence="x")), INVALID, ["'after_sequence'"]),
    ("action: release without writer", action("flightstore.release", custom(op="release", table="t")),
     INVALID, ["'writer_id'"]),
    ("action: snapshot of an unknown table", action("flightstore.snapshot", custom(op="s", table="nope")),
     NOT_FOUND, ["nope"]),
    ("action: unknown flightstore action", action("flightstore.explode", custom(op="x")), UNIMPLEMENTED,
     ["flightstore.explode"]),
    # the other RPCs
    ("list flights", lambda c: list(c.list_flights()), UNIMPLEMENTED, ["ListFlights"]),
    ("get schema", lambda c: c.get_schema(flight.FlightDescriptor.for_command(b"x")), UNIMPLEMENTED,
     ["GetSchema"]),
]


@pytest.mark.parametrize("call,status,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_request_gets_a_clean_error(env, call, status, words) -> None:
    server, client = env
    before = _state(server)
    with pytest.raises(status) as raised:
        call(client)
    message = str(raised.value)
    first = message.splitlines()[0]
    for word in words:
        assert word in first, (word, message)
    assert not LEAKS.search(message), message
    assert str(server.store.data_dir) not in message
    assert _state(server) == before
    _still_serves(client)


def test_unexpected_exceptions_show_an_incident_id_only(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="flightstore.server"):
        try:
            {}["secret_key"]
        except KeyError as exc:
            error = _translate(exc)
    assert isinstance(error, flight.FlightInternalError)
    assert "incident" in str(error) and "KeyError" not in str(error) and "secret_key" not in str(error)
    incident = str(error).split("incident ")[1].split(")")[0]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert incident in logged and "Traceback" in logged and "secret_key" in logged  # the server log has it


def test_a_server_path_in_an_error_is_hidden_from_adbc(tmp_path) -> None:
    """CorruptData names the table's directory: the client sees it relative to <data-dir>."""
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("gone", pa.schema([("id", pa.int64())])).append({"id": [1]})
    shutil.rmtree(read_table_dir(data_dir, "gone"))
    server = RunningServer(data_dir)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(server.uri, autocommit=True)
        try:
            with conn.cursor() as cur:
                with pytest.raises(dbapi.Error) as raised:
                    cur.execute("SELECT * FROM gone")
                    cur.fetch_arrow_table()
                message = str(raised.value)
                assert "default.gone" in message and "<data-dir>/tables/" in message, message
                assert str(tmp_path) not in message and "Traceback" not in message, message
                cur.execute("SELECT 1 AS one")
                assert cur.fetch_arrow_table().to_pylist() == [{"one": 1}]
        finally:
            conn.close()
    finally:
        server.stop()


def test_the_server_log_keeps_whole_tracebacks_while_clients_get_none() -> None:
    from flightstore.server import status
    status.quiet_tracebacks()
    try:
        import traceback
        try:
            {}["k"]
        except KeyError as exc:
            assert "Traceback" not in "".join(traceback.format_exception(exc))  # what pyarrow sends
            record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None,
                                       (type(exc), exc, exc.__traceback__))
        logged = status.TracebackFormatter("%(message)s").format(record)
        assert "Traceback" in logged and "test_malformed.py" in logged
    finally:
        status.loud_tracebacks()
