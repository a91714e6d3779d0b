"""Flight SQL wire messages, built at import time from plain Python declarations.

Flight SQL commands travel as serialized ``google.protobuf.Any`` (``type_url`` +
``value``); Flight core actions (CancelFlightInfo, the session actions) carry raw messages.
Instead of generated ``_pb2`` modules, this module declares each message of
``format/FlightSql.proto`` (package ``arrow.flight.protocol.sql``) and of the parts of
``format/Flight.proto`` we serve (package ``arrow.flight.protocol``) as data, builds a
``FileDescriptorProto`` per package into a private descriptor pool and asks protobuf for the
classes. Field numbers are exactly the spec's; proto3 ``optional`` fields get synthetic oneofs,
so ``HasField`` tells "omitted" from "empty string" (``CommandGetTables.catalog``).

Every message class is a module attribute (``protocol.CommandStatementQuery``) and also
reachable by name through :func:`message_class`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from flightstore.errors import InvalidInput, Unsupported

__all__ = [
    "SQL_PACKAGE", "FLIGHT_PACKAGE", "TYPE_URL_PREFIX",
    "message_class", "message_names", "type_url", "pack_any", "unpack_any", "parse",
    "decode_action", "encode_action_result", "is_flight_sql_action",
    # Flight SQL action types (bodies and results wrapped in Any)
    "CREATE_PREPARED_STATEMENT", "CLOSE_PREPARED_STATEMENT", "CREATE_PREPARED_SUBSTRAIT_PLAN",
    "BEGIN_TRANSACTION", "END_TRANSACTION", "BEGIN_SAVEPOINT", "END_SAVEPOINT", "CANCEL_QUERY",
    # Flight core action types (raw bodies and results)
    "CANCEL_FLIGHT_INFO", "RENEW_FLIGHT_ENDPOINT", "SET_SESSION_OPTIONS", "GET_SESSION_OPTIONS",
    "CLOSE_SESSION", "FLIGHT_SQL_ACTIONS", "FLIGHT_ACTIONS", "ACTION_REQUEST_MESSAGES",
]

SQL_PACKAGE = "arrow.flight.protocol.sql"
FLIGHT_PACKAGE = "arrow.flight.protocol"
TYPE_URL_PREFIX = "type.googleapis.com/"

# ---- action type names (Action.type) --------------------------------------------------------
CREATE_PREPARED_STATEMENT = "CreatePreparedStatement"
CLOSE_PREPARED_STATEMENT = "ClosePreparedStatement"
CREATE_PREPARED_SUBSTRAIT_PLAN = "CreatePreparedSubstraitPlan"
BEGIN_TRANSACTION = "BeginTransaction"
END_TRANSACTION = "EndTransaction"
BEGIN_SAVEPOINT = "BeginSavepoint"
END_SAVEPOINT = "EndSavepoint"
CANCEL_QUERY = "CancelQuery"
CANCEL_FLIGHT_INFO = "CancelFlightInfo"
RENEW_FLIGHT_ENDPOINT = "RenewFlightEndpoint"
SET_SESSION_OPTIONS = "SetSessionOptions"
GET_SESSION_OPTIONS = "GetSessionOptions"
CLOSE_SESSION = "CloseSession"

#: Action type -> request message name. Flight SQL bodies are ``Any``; Flight core bodies are raw.
ACTION_REQUEST_MESSAGES: dict[str, str] = {
    CREATE_PREPARED_STATEMENT: "ActionCreatePreparedStatementRequest",
    CLOSE_PREPARED_STATEMENT: "ActionClosePreparedStatementRequest",
    CREATE_PREPARED_SUBSTRAIT_PLAN: "ActionCreatePreparedSubstraitPlanRequest",
    BEGIN_TRANSACTION: "ActionBeginTransactionRequest",
    END_TRANSACTION: "ActionEndTransactionRequest",
    BEGIN_SAVEPOINT: "ActionBeginSavepointRequest",
    END_SAVEPOINT: "ActionEndSavepointRequest",
    CANCEL_QUERY: "ActionCancelQueryRequest",
    CANCEL_FLIGHT_INFO: "CancelFlightInfoRequest",
    RENEW_FLIGHT_ENDPOINT: "RenewFlightEndpointRequest",
    SET_SESSION_OPTIONS: "SetSessionOptionsRequest",
    GET_SESSION_OPTIONS: "GetSessionOptionsRequest",
    CLOSE_SESSION: "CloseSessionRequest",
}
FLIGHT_SQL_ACTIONS = (CREATE_PREPARED_STATEMENT, CLOSE_PREPARED_STATEMENT,
                      CREATE_PREPARED_SUBSTRAIT_PLAN, BEGIN_TRANSACTION, END_TRANSACTION,
                      BEGIN_SAVEPOINT, END_SAVEPOINT, CANCEL_QUERY)
FLIGHT_ACTIONS = (CANCEL_FLIGHT_INFO, RENEW_FLIGHT_ENDPOINT, SET_SESSION_OPTIONS,
                  GET_SESSION_OPTIONS, CLOSE_SESSION)


# ---- the declarations -----------------------------------------------------------------------
@dataclass(frozen=True)
class _F:
    """One field: ``kind`` is a scalar name, ``enum:<Name>``, ``msg:<Name>`` or ``map:<K>,<V>``.

    Type names are relative to the file's package (``CommandStatementIngest.TableDefinitionOptions``).
    """

    name: str
    number: int
    kind: str
    optional: bool = False       # proto3 `optional` (explicit presence)
    repeated: bool = False
    oneof: str | None = None     # a real oneof this field belongs to


@dataclass(frozen=True)
class _M:
    name: str
    fields: tuple[_F, ...] = ()
    nested: tuple["_M", ...] = ()
    enums: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()


def _enum(name: str, *values: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    return name, tuple((value, number) for number, value in enumerate(values))


def _opt(name: str, number: int, kind: str) -> _F:
    return _F(name, number, kind, optional=True)


_TXN = _opt("transaction_id", 2, "bytes")
_HANDLE = _F("prepared_statement_handle", 1, "bytes")

_SQL_MESSAGES: tuple[_M, ...] = (
    _M("CommandGetSqlInfo", (_F("info", 1, "uint32", repeated=True),)),
    _M("CommandGetXdbcTypeInfo", (_opt("data_type", 1, "int32"),)),
    _M("CommandGetCatalogs"),
    _M("CommandGetDbSchemas", (_opt("catalog", 1, "string"),
                               _opt("db_schema_filter_pattern", 2, "string"))),
    _M("CommandGetTables", (_opt("catalog", 1, "string"), _opt("db_schema_filter_pattern", 2, "string"),
                            _opt("table_name_filter_pattern", 3, "string"),
                            _F("table_types", 4, "string", repeated=True),
                            _F("include_schema", 5, "bool"))),
    _M("CommandGetTableTypes"),
    *(_M(name, (_opt("catalog", 1, "string"), _opt("db_schema", 2, "string"),
                _F("table", 3, "string")))
      for name in ("CommandGetPrimaryKeys", "CommandGetExportedKeys", "CommandGetImportedKeys")),
    _M("CommandGetCrossReference", (_opt("pk_catalog", 1, "string"), _opt("pk_db_schema", 2, "string"),
                                    _F("pk_table", 3, "string"), _opt("fk_catalog", 4, "string"),
                                    _opt("fk_db_schema", 5, "string"), _F("fk_table", 6, "string"))),
    _M("ActionCreatePreparedStatementRequest", (_F("query", 1, "string"), _TXN)),
    _M("SubstraitPlan", (_F("plan", 1, "bytes"), _F("version", 2, "string"))),
    _M("ActionCreatePreparedSubstraitPlanRequest", (_F("plan", 1, "msg:SubstraitPlan"), _TXN)),
    _M("ActionCreatePreparedStatementResult", (_HANDLE, _F("dataset_schema", 2, "bytes"),
                                               _F("parameter_schema", 3, "bytes"))),
    _M("ActionClosePreparedStatementRequest", (_HANDLE,)),
    _M("ActionBeginTransactionRequest"),
    _M("ActionBeginSavepointRequest", (_F("transaction_id", 1, "bytes"), _F("name", 2, "string"))),
    _M("ActionBeginTransactionResult", (_F("transaction_id", 1, "bytes"),)),
    _M("ActionBeginSavepointResult", (_F("savepoint_id", 1, "bytes"),)),
    _M("ActionEndTransactionRequest",
       (_F("transaction_id", 1, "bytes"),
        _F("action", 2, "enum:ActionEndTransactionRequest.EndTransaction")),
       enums=(_enum("EndTransaction", "END_TRANSACTION_UNSPECIFIED", "END_TRANSACTION_COMMIT",
                    "END_TRANSACTION_ROLLBACK"),)),
    _M("ActionEndSavepointRequest",
       (_F("savepoint_id", 1, "bytes"), _F("action", 2, "enum:ActionEndSavepointRequest.EndSavepoint")),
       enums=(_enum("EndSavepoint", "END_SAVEPOINT_UNSPECIFIED", "END_SAVEPOINT_RELEASE",
                    "END_SAVEPOINT_ROLLBACK"),)),
    _M("CommandStatementQuery", (_F("query", 1, "string"), _TXN)),
    _M("CommandStatementSubstraitPlan", (_F("plan", 1, "msg:SubstraitPlan"), _TXN)),
    _M("TicketStatementQuery", (_F("statement_handle", 1, "bytes"),)),
    _M("CommandPreparedStatementQuery", (_HANDLE,)),
    _M("CommandStatementUpdate", (_F("query", 1, "string"), _TXN)),
    _M("CommandPreparedStatementUpdate", (_HANDLE,)),
    _M("CommandStatementIngest",
       (_F("table_definition_options", 1, "msg:CommandStatementIngest.TableDefinitionOptions"),
        _F("table", 2, "string"), _opt("schema", 3, "string"), _opt("catalog", 4, "string"),
        _F("temporary", 5, "bool"), _opt("transaction_id", 6, "bytes"),
        _F("options", 1000, "map:string,string")),
       nested=(_M("TableDefinitionOptions",
                  (_F("if_not_exist", 1, "enum:CommandStatementIngest.TableDefinitionOptions."
                                         "TableNotExistOption"),
                   _F("if_exists", 2, "enum:CommandStatementIngest.TableDefinitionOptions."
                                      "TableExistsOption")),
                  enums=(_enum("TableNotExistOption", "TABLE_NOT_EXIST_OPTION_UNSPECIFIED",
                               "TABLE_NOT_EXIST_OPTION_CREATE", "TABLE_NOT_EXIST_OPTION_FAIL"),
                         _enum("TableExistsOption", "TABLE_EXISTS_OPTION_UNSPECIFIED",
                               "TABLE_EXISTS_OPTION_FAIL", "TABLE_EXISTS_OPTION_APPEND",
                               "TABLE_EXISTS_OPTION_REPLACE"))),)),
    _M("DoPutUpdateResult", (_F("record_count", 1, "int64"),)),
    _M("DoPutPreparedStatementResult", (_opt("prepared_statement_handle", 1, "bytes"),)),
    # ActionCancelQueryRequest.info is a serialized FlightInfo declared as bytes in the spec itself.
    _M("ActionCancelQueryRequest", (_F("info", 1, "bytes"),)),
    _M("ActionCancelQueryResult", (_F("result", 1, "enum:ActionCancelQueryResult.CancelResult"),),
       enums=(_enum("CancelResult", "CANCEL_RESULT_UNSPECIFIED", "CANCEL_RESULT_CANCELLED",
                    "CANCEL_RESULT_CANCELLING", "CANCEL_RESULT_NOT_CANCELLABLE"),)),
)

_FLIGHT_ENUMS = (_enum("CancelStatus", "CANCEL_STATUS_UNSPECIFIED", "CANCEL_STATUS_CANCELLED",
                       "CANCEL_STATUS_CANCELLING", "CANCEL_STATUS_NOT_CANCELLABLE"),)
_FLIGHT_MESSAGES: tuple[_M, ...] = (
    # Flight.proto declares `FlightInfo info = 1` / `FlightEndpoint endpoint = 1`. An embedded
    # message and `bytes` share one wire format (length-delimited), so we declare bytes and let
    # pyarrow decode them: pyarrow.flight.FlightInfo.deserialize / FlightEndpoint.deserialize.
    _M("CancelFlightInfoRequest", (_F("info", 1, "bytes"),)),
    _M("CancelFlightInfoResult", (_F("status", 1, "enum:CancelStatus"),)),
    _M("RenewFlightEndpointRequest", (_F("endpoint", 1, "bytes"),)),
    _M("SessionOptionValue",
       (_F("string_value", 1, "string", oneof="option_value"),
        _F("bool_value", 2, "bool", oneof="option_value"),
        _F("int64_value", 3, "sfixed64", oneof="option_value"),
        _F("double_value", 4, "double", oneof="option_value"),
        _F("string_list_value", 5, "msg:SessionOptionValue.StringListValue", oneof="option_value")),
       nested=(_M("StringListValue", (_F("values", 1, "string", repeated=True),)),)),
    _M("SetSessionOptionsRequest", (_F("session_options", 1, "map:string,SessionOptionValue"),)),
    _M("SetSessionOptionsResult", (_F("errors", 1, "map:string,SetSessionOptionsResult.Error"),),
       nested=(_M("Error", (_F("value", 1, "enum:SetSessionOptionsResult.ErrorValue"),)),),
       enums=(_enum("ErrorValue", "UNSPECIFIED", "INVALID_NAME", "INVALID_VALUE", "ERROR"),)),
    _M("GetSessionOptionsRequest"),
    _M("GetSessionOptionsResult", (_F("session_options", 1, "map:string,SessionOptionValue"),)),
    _M("CloseSessionRequest"),
    _M("CloseSessionResult", (_F("status", 1, "enum:CloseSessionResult.Status"),),
       enums=(_enum("Status", "UNSPECIFIED", "CLOSED", "CLOSING", "NOT_CLOSEABLE"),)),
)


# ---- building descriptors -------------------------------------------------------------------
_FD = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _FD.TYPE_STRING, "bytes": _FD.TYPE_BYTES, "bool": _FD.TYPE_BOOL,
    "int32": _FD.TYPE_INT32, "int64": _FD.TYPE_INT64, "uint32": _FD.TYPE_UINT32,
    "sfixed64": _FD.TYPE_SFIXED64, "double": _FD.TYPE_DOUBLE,
}


def _set_type(field: descriptor_pb2.FieldDescriptorProto, kind: str, package: str) -> None:
    if kind.startswith("enum:"):
        field.type = _FD.TYPE_ENUM
        field.type_name = f".{package}.{kind[5:]}"
    elif kind.startswith("msg:"):
        field.type = _FD.TYPE_MESSAGE
        field.type_name = f".{package}.{kind[4:]}"
    else:
        field.type = _SCALARS[kind]


def _add_message(container: descriptor_pb2.DescriptorProto | descriptor_pb2.FileDescriptorProto,
                 spec: _M, package: str, scope: str) -> None:
    proto = container.message_type.add() if isinstance(
        container, descriptor_pb2.FileDescriptorProto) else container.nested_type.add()
    proto.name = spec.name
    full_name = f"{scope}.{spec.name}" if scope else spec.name
    for enum_name, values in spec.enums:
        enum = proto.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for nested in spec.nested:
        _add_message(proto, nested, package, full_name)
    real_oneofs = list(dict.fromkeys(f.oneof for f in spec.fields if f.oneof))
    for oneof in real_oneofs:
        proto.oneof_decl.add(name=oneof)
    synthetic = 0
    for spec_field in spec.fields:
        field = proto.field.add(name=spec_field.name, number=spec_field.number, json_name=_camel(
            spec_field.name))
        if spec_field.kind.startswith("map:"):
            key_kind, value_kind = spec_field.kind[4:].split(",")
            entry_name = "".join(p.capitalize() for p in spec_field.name.split("_")) + "Entry"
            entry = proto.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            for name, number, kind in (("key", 1, key_kind), ("value", 2, value_kind)):
                entry_field = entry.field.add(name=name, number=number, label=_FD.LABEL_OPTIONAL,
                                              json_name=name)
                _set_type(entry_field, kind if kind in _SCALARS else f"msg:{kind}", package)
            field.label = _FD.LABEL_REPEATED
            field.type = _FD.TYPE_MESSAGE
            field.type_name = f".{package}.{full_name}.{entry_name}"
            continue
        field.label = _FD.LABEL_REPEATED if spec_field.repeated else _FD.LABEL_OPTIONAL
        _set_type(field, spec_field.kind, package)
        if spec_field.oneof:
            field.oneof_index = real_oneofs.index(spec_field.oneof)
        elif spec_field.optional:
            # proto3 `optional`: a synthetic oneof named `_<field>`, declared after the real ones.
            field.proto3_optional = True
            field.oneof_index = len(real_oneofs) + synthetic
            proto.oneof_decl.add(name=f"_{spec_field.name}")
            synthetic += 1


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _file(name: str, package: str, messages: Iterable[_M],
          enums: Iterable[tuple[str, tuple[tuple[str, int], ...]]] = ()) -> \
        descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for enum_name, values in enums:
        enum = proto.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for spec in messages:
        _add_message(proto, spec, package, "")
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file("flightstore/FlightSql.proto", SQL_PACKAGE, _SQL_MESSAGES))
_POOL.Add(_file("flightstore/Flight.proto", FLIGHT_PACKAGE, _FLIGHT_MESSAGES, _FLIGHT_ENUMS))

#: Short name -> class, for every top-level message of both packages.
_CLASSES: dict[str, type[Message]] = {}
#: Full name (``arrow.flight.protocol.sql.CommandStatementQuery``) -> class.
_BY_FULL_NAME: dict[str, type[Message]] = {}
for _package, _specs in ((SQL_PACKAGE, _SQL_MESSAGES), (FLIGHT_PACKAGE, _FLIGHT_MESSAGES)):
    for _spec in _specs:
        _cls = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_package}.{_spec.name}"))
        _CLASSES[_spec.name] = _cls
        _BY_FULL_NAME[f"{_package}.{_spec.name}"] = _cls
        globals()[_spec.name] = _cls
        __all__.append(_spec.name)
del _package, _specs, _spec, _cls


# ---- public helpers -------------------------------------------------------------------------
def message_class(name: str) -> type[Message]:
    """The class of a message by short (``CommandGetTables``) or full name; unknown -> Unsupported."""
    cls = _CLASSES.get(name) or _BY_FULL_NAME.get(name)
    if cls is None:
        raise Unsupported(f"unknown Flight SQL message {name!r}")
    return cls


def message_names() -> list[str]:
    """Short names of every declared top-level message (both packages)."""
    return list(_CLASSES)


def type_url(message: Message | type[Message]) -> str:
    """``type.googleapis.com/<full name>`` of a message or message class."""
    return TYPE_URL_PREFIX + message.DESCRIPTOR.full_name


def pack_any(message: Message) -> bytes:
    """Serialize ``message`` wrapped in ``google.protobuf.Any`` (the Flight SQL command form)."""
    return any_pb2.Any(type_url=type_url(message), value=message.SerializeToString()).SerializeToString()


def unpack_any(data: bytes) -> Message:
    """Decode a serialized ``Any`` into the message its type_url names.

    Raises :class:`Unsupported` for a well-formed Any of a type we do not know (naming the type)
    and :class:`InvalidInput` for bytes that are not a valid Any or payload.
    """
    envelope = any_pb2.Any()
    try:
        envelope.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise InvalidInput(f"malformed Flight SQL command: {exc}") from None
    full_name = envelope.type_url.rsplit("/", 1)[-1]
    cls = _BY_FULL_NAME.get(full_name)
    if cls is None:
        shown = envelope.type_url or "<empty type_url>"
        raise Unsupported(f"unsupported Flight SQL command type {shown!r}")
    return _parse_into(cls, envelope.value)


def parse(message: str | type[Message], data: bytes) -> Message:
    """Decode raw (not Any-wrapped) bytes as ``message`` (a class or a name).

    Used for Flight core action bodies and DoPut ``app_metadata``; bad bytes -> InvalidInput.
    """
    cls = message_class(message) if isinstance(message, str) else message
    return _parse_into(cls, data)


def _parse_into(cls: type[Message], data: bytes) -> Message:
    result = cls()
    try:
        result.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise InvalidInput(f"malformed {cls.DESCRIPTOR.name}: {exc}") from None
    return result


def is_flight_sql_action(action_type: str) -> bool:
    """True for Flight SQL actions (Any-wrapped); False for Flight core ones (raw messages)."""
    return action_type in FLIGHT_SQL_ACTIONS


def decode_action(action_type: str, body: bytes) -> Message:
    """Decode a DoAction body by its action type, applying the spec's wrapping rule.

    Flight SQL actions carry an ``Any`` that must hold the action's request message; Flight core
    actions carry the raw request. Unknown action types -> :class:`Unsupported`; a body of the
    wrong message type -> :class:`InvalidInput`.
    """
    name = ACTION_REQUEST_MESSAGES.get(action_type)
    if name is None:
        raise Unsupported(f"unsupported action type {action_type!r}")
    if not is_flight_sql_action(action_type):
        return parse(name, body)
    message = unpack_any(body) if body else message_class(name)()
    if message.DESCRIPTOR.name != name:
        raise InvalidInput(
            f"action {action_type!r} expects {name}, got {message.DESCRIPTOR.name}")
    return message


def encode_action_result(message: Message) -> bytes:
    """Serialize a DoAction result: ``Any``-wrapped for Flight SQL messages, raw for Flight core."""
    if message.DESCRIPTOR.full_name.startswith(SQL_PACKAGE + "."):
        return pack_any(message)
    return message.SerializeToString()
