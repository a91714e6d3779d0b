"""The calls the Arrow Flight SQL JDBC driver makes, replayed with raw pyarrow.flight.

The JDBC jar is only on Maven, so each test sends the exact messages the driver sends (read from
its source): GetSqlInfo for every id, prepare-then-decide-by-dataset_schema, typed parameters,
DoPut updates, the metadata commands behind DatabaseMetaData, cancel and session actions.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.errors import FlightstoreError
from flightstore.server import metadata, protocol


@pytest.fixture
def client(server):
    c = flight.FlightClient(server.uri)
    yield c
    c.close()


def _info(client: flight.FlightClient, command) -> flight.FlightInfo:
    return client.get_flight_info(flight.FlightDescriptor.for_command(protocol.pack_any(command)))


def _read(client: flight.FlightClient, info: flight.FlightInfo) -> pa.Table:
    """Read every endpoint the way the JDBC driver does; checks each stream's schema."""
    tables = []
    for endpoint in info.endpoints:
        assert endpoint.locations == [], "flightstore endpoints mean 'this server'"
        reader = client.do_get(endpoint.ticket)
        table = reader.read_all()
        assert table.schema.equals(info.schema), (table.schema, info.schema)
        tables.append(table)
    return pa.concat_tables(tables) if tables else info.schema.empty_table()


def _fetch(client: flight.FlightClient, command) -> pa.Table:
    return _read(client, _info(client, command))


def _sql_action(client: flight.FlightClient, kind: str, request) -> list:
    results = list(client.do_action(flight.Action(kind, protocol.pack_any(request))))
    return [protocol.unpack_any(r.body.to_pybytes()) for r in results]


def _prepare(client: flight.FlightClient, sql: str):
    [result] = _sql_action(client, protocol.CREATE_PREPARED_STATEMENT,
                           protocol.ActionCreatePreparedStatementRequest(query=sql))
    assert result.DESCRIPTOR.name == "ActionCreatePreparedStatementResult"
    return result


def _close(client: flight.FlightClient, handle: bytes) -> None:
    _sql_action(client, protocol.CLOSE_PREPARED_STATEMENT,
                protocol.ActionClosePreparedStatementRequest(prepared_statement_handle=handle))


def _schema(data: bytes) -> pa.Schema | None:
    return pa.ipc.read_schema(pa.py_buffer(data)) if data else None


def _update(client: flight.FlightClient, sql: str) -> int:
    """A plain statement update (Statement.executeUpdate without parameters)."""
    descriptor = flight.FlightDescriptor.for_command(
        protocol.pack_any(protocol.CommandStatementUpdate(query=sql)))
    writer, reader = client.do_put(descriptor, pa.schema([]))
    writer.done_writing()
    buffer = reader.read()
    writer.close()
    return protocol.parse("DoPutUpdateResult", buffer.to_pybytes()).record_count


@pytest.fixture
def users(server, client):
    assert _update(client, "CREATE TABLE users (id BIGINT, name STRING, score DOUBLE, "
                           "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '3')") == 0
    assert _update(client, "INSERT INTO users VALUES (1, 'a', 1.0), (2, 'b', 2.0), (3, 'c', 3.0)") == 3
    return server.store.table("users")


# ---- GetSqlInfo ---------------------------------------------------------------------------------
def test_sql_info_without_ids_answers_every_id(client) -> None:
    table = _fetch(client, protocol.CommandGetSqlInfo())
    assert table.schema.equals(metadata.SQL_INFO_SCHEMA)
    ids = table.column("info_name").to_pylist()
    assert sorted(ids) == sorted(metadata.SQL_INFO)
    assert len(ids) == len(set(ids))
    values = dict(zip(ids, table.column("value").to_pylist()))
    assert values[0] == "flightstore"          # FLIGHT_SQL_SERVER_NAME


def test_sql_info_with_ids_answers_just_those(client) -> None:
    table = _fetch(client, protocol.CommandGetSqlInfo(info=[0, 8, 504]))
    assert table.column("info_name").to_pylist() == [0, 8, 504]
    values = dict(zip([0, 8, 504], table.column("value").to_pylist()))
    assert values == {0: "flightstore", 8: 0, 504: '"'}


# ---- prepared statements ------------------------------------------------------------------------
def test_prepared_select_has_its_schema_before_it_runs(client, users) -> None:
    sql = "SELECT id, name FROM users WHERE id = ?"
    prepared = _prepare(client, sql)
    dataset = _schema(prepared.dataset_schema)
    assert dataset is not None and dataset.names == ["id", "name"]
    params = _schema(prepared.parameter_schema)
    assert [(f.name, f.type) for f in params] == [("0", pa.int64())]

    # bind (DoPut CommandPreparedStatementQuery), then GetFlightInfo + DoGet
    command = protocol.CommandPreparedStatementQuery(prepared_statement_handle=prepared.prepared_statement_handle)
    descriptor = flight.FlightDescriptor.for_command(protocol.pack_any(command))
    batch = pa.record_batch([pa.array([2], pa.int64())], schema=params)
    writer, reader = client.do_put(descriptor, params)
    writer.write_batch(batch)
    writer.done_writing()
    answer = protocol.parse("DoPutPreparedStatementResult", reader.read().to_pybytes())
    writer.close()
    handle = answer.prepared_statement_handle if answer.HasField("prepared_statement_handle") \
        else prepared.prepared_statement_handle
    command = protocol.CommandPreparedStatementQuery(prepared_statement_handle=handle)
    info = _info(client, command)
    assert info.schema.equals(dataset)       # nullability included
    table = _read(client, info)
    assert table.schema.equals(dataset)
    assert table.to_pylist() == [{"id": 2, "name": "b"}]
    _close(client, prepared.prepared_statement_handle)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM users",
    "SELECT name, score FROM users WHERE score > 1.5",
    "SELECT COUNT(*) FROM users",
    "SELECT name, COUNT(*) AS n FROM users GROUP BY name ORDER BY name",
    "SELECT * FROM users$changelog",
    "SELECT 1 AS one",
])
def test_prepared_query_schema_equals_flight_info_and_stream(client, users, sql) -> None:
    prepared = _prepare(client, sql)
    dataset = _schema(prepared.dataset_schema)
    assert dataset is not None and len(dataset) > 0
    info = _info(client, protocol.CommandPreparedStatementQuery(
        prepared_statement_handle=prepared.prepared_statement_handle))
    assert info.schema.equals(dataset), (info.schema, dataset)
    table = _read(client, info)
    assert table.num_rows > 0
    _close(client, prepared.prepared_statement_handle)


@pytest.mark.parametrize("sql", [
    "INSERT INTO users VALUES (9, 'z', 9.0)",
    "UPDATE users SET score = 0 WHERE id = 1",
    "DELETE FROM users WHERE id = 1",
    "CREATE TABLE other (x BIGINT)",
])
def test_prepared_update_or_ddl_has_an_empty_dataset_schema(server, client, users, sql) -> None:
    before = users.row_count()
    prepared = _prepare(client, sql)
    assert prepared.dataset_schema == b""
    # preparing must not run the statement
    assert users.row_count() == before
    assert server.store.list_tables("default") == ["users"]
    _close(client, prepared.prepared_statement_handle)


def test_parameter_schemas_are_concrete(client, users) -> None:
    for sql, expected in [
        ("SELECT * FROM users WHERE id = ?", [pa.int64()]),
        ("INSERT INTO users VALUES (?, ?, ?)", [pa.int64(), pa.string(), pa.float64()]),
        ("INSERT INTO users (id, name) VALUES (?, ?)", [pa.int64(), pa.string()]),
        ("UPDATE users SET name = ? WHERE id = ?", [pa.string(), pa.int64()]),
    ]:
        prepared = _prepare(client, sql)
        params = _schema(prepared.parameter_schema)
        assert [f.type for f in params] == expected, sql
        assert [f.name for f in params] == [str(i) for i in range(len(expected))]
        for f in params:
            assert not pa.types.is_null(f.type) and not pa.types.is_union(f.type)
        _close(client, prepared.prepared_statement_handle)


def test_prepared_update_runs_through_do_put_with_parameters(client, users) -> None:
    prepared = _prepare(client, "INSERT INTO users (id, name) VALUES (?, ?)")
    assert prepared.dataset_schema == b""
    params = _schema(prepared.parameter_schema)
    command = protocol.CommandPreparedStatementUpdate(prepared_statement_handle=prepared.prepared_statement_handle)
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(protocol.pack_any(command)), params)
    writer.write_batch(pa.record_batch([pa.array([3, 4, 5], pa.int64()), pa.array(["cc", "d", "e"])],
                                       schema=params))
    writer.done_writing()
    raw = reader.read().to_pybytes()
    writer.close()
    # app_metadata is the raw DoPutUpdateResult, not an Any
    result = protocol.DoPutUpdateResult()
    result.ParseFromString(raw)
    assert result.record_count == 3
    with pytest.raises(FlightstoreError):
        protocol.unpack_any(raw)
    _close(client, prepared.prepared_statement_handle)
    assert users.row_count() == 5
    rows = _fetch(client, protocol.CommandStatementQuery(query="SELECT * FROM users WHERE id >= 3"))
    assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 3, "name": "cc", "score": 3.0}, {"id": 4, "name": "d", "score": None},
        {"id": 5, "name": "e", "score": None}]


# ---- DatabaseMetaData ---------------------------------------------------------------------------
def test_get_tables_with_and_without_schema(server, client, users) -> None:
    plain = _fetch(client, protocol.CommandGetTables())
    assert plain.schema.equals(metadata.TABLES_SCHEMA)
    assert plain.to_pylist() == [{"catalog_name": "flightstore", "db_schema_name": "default",
                                  "table_name": "users", "table_type": "TABLE"}]
    full = _fetch(client, protocol.CommandGetTables(include_schema=True, table_name_filter_pattern="us%"))
    assert full.schema.equals(metadata.TABLES_SCHEMA_WITH_SCHEMA)
    assert full.num_rows == 1
    schema = pa.ipc.read_schema(pa.py_buffer(full.column("table_schema")[0].as_py()))
    assert schema.equals(users.schema)  # field metadata aside: same names, types, nullability
    assert _fetch(client, protocol.CommandGetTables(table_name_filter_pattern="nope%")).num_rows == 0


def test_primary_keys_and_foreign_keys(client, users) -> None:
    keys = _fetch(client, protocol.CommandGetPrimaryKeys(table="users"))
    assert keys.schema.equals(metadata.PRIMARY_KEYS_SCHEMA)
    assert [(r["table_name"], r["column_name"], r["key_sequence"]) for r in keys.to_pylist()] == [
        ("users", "id", 1)]
    for command, schema in [
        (protocol.CommandGetImportedKeys(table="users"), metadata.IMPORTED_KEYS_SCHEMA),
        (protocol.CommandGetExportedKeys(table="users"), metadata.EXPORTED_KEYS_SCHEMA),
        (protocol.CommandGetCrossReference(pk_table="users", fk_table="users"),
         metadata.CROSS_REFERENCE_SCHEMA),
    ]:
        info = _info(client, command)
        assert info.schema.equals(schema)
        table = _read(client, info)
        assert table.num_rows == 0 and table.schema.equals(schema)


def test_table_types_catalogs_db_schemas_and_type_info(server, client) -> None:
    server.store.create_database("sales")
    server.store.create_database("stage")
    assert _fetch(client, protocol.CommandGetTableTypes()).to_pylist() == [{"table_type": "TABLE"}]
    assert _fetch(client, protocol.CommandGetCatalogs()).to_pylist() == [{"catalog_name": "flightstore"}]
    all_schemas = _fetch(client, protocol.CommandGetDbSchemas()).column("db_schema_name").to_pylist()
    assert {"default", "sales", "stage"} <= set(all_schemas)
    like = _fetch(client, protocol.CommandGetDbSchemas(db_schema_filter_pattern="sa%"))
    assert like.schema.equals(metadata.DB_SCHEMAS_SCHEMA)
    assert like.column("db_schema_name").to_pylist() == ["sales"]
    single = _fetch(client, protocol.CommandGetDbSchemas(db_schema_filter_pattern="st_ge"))
    assert single.column("db_schema_name").to_pylist() == ["stage"]
    types = _fetch(client, protocol.CommandGetXdbcTypeInfo())
    assert types.schema.equals(metadata.XDBC_TYPE_INFO_SCHEMA)
    names = types.column("type_name").to_pylist()
    assert {"BIGINT", "DOUBLE"} <= set(names)
    bigint = _fetch(client, protocol.CommandGetXdbcTypeInfo(data_type=-5))
    assert set(bigint.column("data_type").to_pylist()) == {-5}


# ---- endpoints, cancel, session -----------------------------------------------------------------
def test_endpoints_without_locations_are_read_on_the_same_connection(client, users) -> None:
    request = protocol.SetSessionOptionsRequest()
    request.session_options["flightstore.per-bucket-endpoints"].bool_value = True
    list(client.do_action(flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString())))
    info = _info(client, protocol.CommandStatementQuery(query="SELECT * FROM users"))
    assert len(info.endpoints) == 3
    assert all(e.locations == [] for e in info.endpoints)
    table = _read(client, info)
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3]


def test_cancel_flight_info_cancels_its_tickets(client, users) -> None:
    info = _info(client, protocol.CommandStatementQuery(query="SELECT * FROM users"))
    request = protocol.CancelFlightInfoRequest(info=info.serialize())
    results = list(client.do_action(flight.Action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())))
    assert len(results) == 1
    status = protocol.parse("CancelFlightInfoResult", results[0].body.to_pybytes()).status
    assert status == 1  # CANCEL_STATUS_CANCELLED
    for endpoint in info.endpoints:
        with pytest.raises(flight.FlightCancelledError):
            client.do_get(endpoint.ticket).read_all()
    # a new FlightInfo for the same SQL is not affected
    again = _info(client, protocol.CommandStatementQuery(query="SELECT * FROM users"))
    assert _read(client, again).num_rows == 3
    # cancelling a metadata FlightInfo does not break later metadata calls
    tables = _info(client, protocol.CommandGetTables())
    request = protocol.CancelFlightInfoRequest(info=tables.serialize())
    list(client.do_action(flight.Action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())))
    assert _fetch(client, protocol.CommandGetTables()).num_rows == 1


def _set_session(client, **values) -> dict:
    request = protocol.SetSessionOptionsRequest()
    for key, value in values.items():
        if isinstance(value, bool):
            request.session_options[key].bool_value = value
        else:
            request.session_options[key].string_value = value
    action = flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString())
    [answer] = list(client.do_action(action))
    errors = protocol.parse("SetSessionOptionsResult", answer.body.to_pybytes()).errors
    return {key: error.value for key, error in errors.items()}


def test_session_actions(client) -> None:
    _update(client, "CREATE DATABASE shop")
    assert _set_session(client, schema="shop") == {}
    assert _session_options(client)["schema"] == "shop"
    assert _session_options(client)["catalog"] == "flightstore"
    [answer] = list(client.do_action(flight.Action(
        protocol.CLOSE_SESSION, protocol.CloseSessionRequest().SerializeToString())))
    assert protocol.parse("CloseSessionResult", answer.body.to_pybytes()).status == 1  # CLOSED
    assert _session_options(client)["schema"] == "default"  # a closed session starts over


def test_session_options_refused_change_nothing(client) -> None:
    """An unknown name is refused in the result (INVALID_NAME = 1); a bad value fails the call
    with a message naming the option and what is wrong (the result's INVALID_VALUE cannot say
    why); either way none of the request's options is applied."""
    _update(client, "CREATE DATABASE shop")
    assert _set_session(client, schema="shop", nope="x") == {"nope": 1}
    with pytest.raises(pa.ArrowKeyError, match="session option 'schema': database 'no_such_db' does not exist"):
        _set_session(client, schema="no_such_db")
    with pytest.raises(pa.ArrowInvalid, match="session option 'catalog': the only catalog is 'flightstore'"):
        _set_session(client, catalog="other", schema="shop")
    assert _session_options(client)["schema"] == "default"
    assert _set_session(client, catalog="flightstore", schema="SHOP") == {}
    assert _session_options(client)["schema"] == "shop"


def _session_options(client) -> dict:
    [answer] = list(client.do_action(flight.Action(
        protocol.GET_SESSION_OPTIONS, protocol.GetSessionOptionsRequest().SerializeToString())))
    options = protocol.parse("GetSessionOptionsResult", answer.body.to_pybytes()).session_options
    return {key: getattr(value, value.WhichOneof("option_value")) for key, value in options.items()}


def test_session_options_belong_to_their_connection(client, server) -> None:
    _update(client, "CREATE DATABASE shop")
    assert _set_session(client, schema="shop") == {}
    other = flight.FlightClient(server.uri)
    try:
        assert _session_options(other)["schema"] == "default"
        assert _session_options(client)["schema"] == "shop"
    finally:
        other.close()
