"""Flight SQL wire messages: field numbers, Any packing, action decoding, and a real ADBC client."""

from __future__ import annotations

import struct
import warnings

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_flightsql import dbapi
from google.protobuf import any_pb2

from flightstore.errors import InvalidInput, Unsupported
from flightstore.server import protocol

# ---- every message the brief names exists, in the right package -----------------------------
SQL_MESSAGES = [
    "CommandGetSqlInfo", "CommandGetXdbcTypeInfo", "CommandGetCatalogs", "CommandGetDbSchemas",
    "CommandGetTables", "CommandGetTableTypes", "CommandGetPrimaryKeys", "CommandGetExportedKeys",
    "CommandGetImportedKeys", "CommandGetCrossReference", "CommandStatementQuery",
    "CommandStatementSubstraitPlan", "CommandPreparedStatementQuery", "CommandStatementUpdate",
    "CommandPreparedStatementUpdate", "CommandStatementIngest", "TicketStatementQuery",
    "ActionCreatePreparedStatementRequest", "ActionCreatePreparedStatementResult",
    "ActionClosePreparedStatementRequest", "ActionBeginTransactionRequest",
    "ActionBeginTransactionResult", "ActionEndTransactionRequest", "ActionBeginSavepointRequest",
    "ActionBeginSavepointResult", "ActionEndSavepointRequest", "ActionCancelQueryRequest",
    "ActionCancelQueryResult", "ActionCreatePreparedSubstraitPlanRequest", "DoPutUpdateResult",
    "DoPutPreparedStatementResult", "SubstraitPlan",
]
FLIGHT_MESSAGES = [
    "CancelFlightInfoRequest", "CancelFlightInfoResult", "SessionOptionValue",
    "SetSessionOptionsRequest", "SetSessionOptionsResult", "GetSessionOptionsRequest",
    "GetSessionOptionsResult", "CloseSessionRequest", "CloseSessionResult",
    "RenewFlightEndpointRequest",
]


@pytest.mark.parametrize("name", SQL_MESSAGES)
def test_sql_messages_live_in_the_flight_sql_package(name: str) -> None:
    cls = getattr(protocol, name)
    assert cls is protocol.message_class(name)
    assert cls.DESCRIPTOR.full_name == f"arrow.flight.protocol.sql.{name}"


@pytest.mark.parametrize("name", FLIGHT_MESSAGES)
def test_flight_messages_live_in_the_flight_package(name: str) -> None:
    assert protocol.message_class(name).DESCRIPTOR.full_name == f"arrow.flight.protocol.{name}"


# ---- field numbers, proven by hand-computed wire bytes --------------------------------------
def test_command_get_tables_wire_bytes() -> None:
    message = protocol.CommandGetTables(catalog="c", db_schema_filter_pattern="d%",
                                        table_name_filter_pattern="t_", include_schema=True)
    message.table_types.append("TABLE")
    # field 1 string, 2 string, 3 string, 4 repeated string, 5 varint bool
    expected = (b"\x0a\x01c" + b"\x12\x02d%" + b"\x1a\x02t_" + b"\x22\x05TABLE" + b"\x28\x01")
    assert message.SerializeToString() == expected


def test_command_statement_ingest_wire_bytes() -> None:
    message = protocol.CommandStatementIngest(table="t", schema="db", transaction_id=b"x",
                                              temporary=True)
    options = message.table_definition_options
    options.if_not_exist = options.TABLE_NOT_EXIST_OPTION_CREATE    # 1
    options.if_exists = options.TABLE_EXISTS_OPTION_APPEND          # 2
    message.options["k"] = "v"
    expected = (b"\x0a\x04\x08\x01\x10\x02"        # 1: TableDefinitionOptions{1: 1, 2: 2}
                + b"\x12\x01t" + b"\x1a\x02db"       # 2: table, 3: schema
                + b"\x28\x01" + b"\x32\x01x"         # 5: temporary, 6: transaction_id
                + b"\xc2\x3e\x06\x0a\x01k\x12\x01v")  # 1000: map entry {1: "k", 2: "v"}
    assert message.SerializeToString() == expected


def test_session_option_value_uses_sfixed64_and_a_oneof() -> None:
    request = protocol.SetSessionOptionsRequest()
    request.session_options["a"].int64_value = 5
    value = b"\x19" + struct.pack("<q", 5)                      # field 3, wire type 1 (64-bit)
    entry = b"\x0a\x01a" + b"\x12" + bytes([len(value)]) + value
    assert request.SerializeToString() == b"\x0a" + bytes([len(entry)]) + entry
    assert request.session_options["a"].WhichOneof("option_value") == "int64_value"
    request.session_options["a"].string_list_value.values.extend(["x", "y"])
    assert request.session_options["a"].WhichOneof("option_value") == "string_list_value"


def test_misc_field_numbers() -> None:
    assert protocol.DoPutUpdateResult(record_count=3).SerializeToString() == b"\x08\x03"
    assert protocol.ActionEndTransactionRequest(
        transaction_id=b"t", action=2).SerializeToString() == b"\x0a\x01t\x10\x02"
    assert protocol.CommandGetCrossReference(
        pk_table="a", fk_table="b").SerializeToString() == b"\x1a\x01a\x32\x01b"
    assert protocol.CommandGetSqlInfo(info=[0, 500]).SerializeToString() == b"\x0a\x03\x00\xf4\x03"
    assert protocol.CancelFlightInfoResult(status=1).SerializeToString() == b"\x08\x01"


def test_proto3_optional_tracks_presence() -> None:
    omitted = protocol.CommandGetTables()
    empty = protocol.CommandGetTables(catalog="")
    assert not omitted.HasField("catalog")
    assert empty.HasField("catalog")
    assert empty.SerializeToString() == b"\x0a\x00"
    decoded = protocol.parse("CommandGetTables", b"\x0a\x00")
    assert decoded.HasField("catalog") and decoded.catalog == ""
    assert not protocol.CommandGetXdbcTypeInfo().HasField("data_type")
    assert protocol.CommandGetXdbcTypeInfo(data_type=0).HasField("data_type")
    assert not protocol.DoPutPreparedStatementResult().HasField("prepared_statement_handle")


# ---- Any packing ----------------------------------------------------------------------------
def test_pack_any_round_trip_and_type_url() -> None:
    message = protocol.CommandStatementQuery(query="SELECT 1", transaction_id=b"tx")
    data = protocol.pack_any(message)
    envelope = any_pb2.Any.FromString(data)
    assert envelope.type_url == "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    decoded = protocol.unpack_any(data)
    assert isinstance(decoded, protocol.CommandStatementQuery)
    assert decoded == message


@pytest.mark.parametrize("name", SQL_MESSAGES + FLIGHT_MESSAGES)
def test_every_message_round_trips_through_any(name: str) -> None:
    message = protocol.message_class(name)()
    assert type(protocol.unpack_any(protocol.pack_any(message))) is type(message)


def test_unknown_type_url_is_unsupported_and_named() -> None:
    data = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandNope",
                       value=b"").SerializeToString()
    with pytest.raises(Unsupported, match="CommandNope"):
        protocol.unpack_any(data)
    with pytest.raises(Unsupported):
        protocol.message_class("CommandNope")


def test_malformed_bytes_are_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        protocol.unpack_any(b"\xff\xff\xff")
    with pytest.raises(InvalidInput):
        protocol.parse("CommandGetTables", b"\x0a\x05ab")  # truncated string


# ---- action decoding ------------------------------------------------------------------------
def test_decode_action_applies_the_wrapping_rule() -> None:
    request = protocol.ActionCreatePreparedStatementRequest(query="SELECT 2")
    decoded = protocol.decode_action(protocol.CREATE_PREPARED_STATEMENT, protocol.pack_any(request))
    assert decoded.query == "SELECT 2"
    # Flight core actions carry raw messages.
    cancel = protocol.CancelFlightInfoRequest(info=b"\x0a\x00")
    assert protocol.decode_action(protocol.CANCEL_FLIGHT_INFO, cancel.SerializeToString()) == cancel
    assert isinstance(protocol.decode_action(protocol.CLOSE_SESSION, b""),
                      protocol.CloseSessionRequest)
    with pytest.raises(InvalidInput, match="expects ActionClosePreparedStatementRequest"):
        protocol.decode_action(protocol.CLOSE_PREPARED_STATEMENT, protocol.pack_any(request))
    with pytest.raises(Unsupported, match="Frobnicate"):
        protocol.decode_action("Frobnicate", b"")


def test_encode_action_result_wraps_only_flight_sql_messages() -> None:
    result = protocol.ActionCreatePreparedStatementResult(prepared_statement_handle=b"h")
    assert protocol.unpack_any(protocol.encode_action_result(result)) == result
    closed = protocol.CloseSessionResult(status=protocol.CloseSessionResult.CLOSED)
    assert protocol.encode_action_result(closed) == b"\x08\x01"


def test_cancel_flight_info_carries_a_real_flight_info() -> None:
    schema = pa.schema([("a", pa.int64())])
    info = flight.FlightInfo(schema, flight.FlightDescriptor.for_command(b"cmd"),
                             [flight.FlightEndpoint(b"ticket", [])], -1, -1)
    request = protocol.CancelFlightInfoRequest(info=info.serialize())
    decoded = protocol.decode_action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())
    back = flight.FlightInfo.deserialize(decoded.info)
    assert back.schema == schema
    assert back.endpoints[0].ticket.ticket == b"ticket"


# ---- a real client: adbc_driver_flightsql ---------------------------------------------------
class _NoAuth(flight.ServerAuthHandler):
    """Accept every handshake: pyarrow refuses ADBC's handshake without an auth handler."""

    def authenticate(self, outgoing, incoming):  # noqa: ANN001
        pass

    def is_valid(self, token):  # noqa: ANN001
        return b""


class _RecordingServer(flight.FlightServerBase):
    """Decodes every command and action with :mod:`protocol`, records it, answers UNIMPLEMENTED."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0", auth_handler=_NoAuth())
        self.commands: list = []
        self.actions: list = []

    def get_flight_info(self, context, descriptor):  # noqa: ANN001
        self.commands.append(protocol.unpack_any(descriptor.command))
        raise NotImplementedError("recording server")

    def do_action(self, context, action):  # noqa: ANN001
        self.actions.append((action.type,
                             protocol.decode_action(action.type, action.body.to_pybytes())))
        raise NotImplementedError("recording server")


def test_decodes_what_the_adbc_driver_sends() -> None:
    with _RecordingServer() as server:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Cannot disable autocommit"
            conn = dbapi.connect(f"grpc://127.0.0.1:{server.port}")
        try:
            cursor = conn.cursor()
            with pytest.raises(Exception):
                cursor.execute("SELECT 1")
            cursor.close()
        finally:
            conn.close()
    action_type, request = server.actions[0]
    assert action_type == protocol.CREATE_PREPARED_STATEMENT
    assert isinstance(request, protocol.ActionCreatePreparedStatementRequest)
    assert request.query == "SELECT 1"
    assert not request.HasField("transaction_id")
    # ADBC falls back to an ad-hoc query when preparing is UNIMPLEMENTED.
    queries = [c for c in server.commands if isinstance(c, protocol.CommandStatementQuery)]
    assert [q.query for q in queries] == ["SELECT 1"]
    # On connect it asked whether we support transactions (GetSqlInfo [8]).
    infos = [c for c in server.commands if isinstance(c, protocol.CommandGetSqlInfo)]
    assert infos and 8 in infos[0].info
