"""The lookup stream's messages: one Flight DoExchange per client connection, one message each way
per lookup (or batch of keys), keys and rows as Arrow, no JSON and no SQL per call.

The stream is opened with the command :data:`STREAM_COMMAND`. Every message travels in a Flight
message's ``app_metadata`` (no data body: one stream carries lookups of many tables, whose key and
row schemas differ, and a Flight stream has one schema). A message is a fixed little-endian header,
then a body:

========  ===================================================================================
request   ``kind u8, flags u8, reserved u16, handle u32, request id u64, limit i64`` (24 bytes)
reply     ``kind u8, flags u8, reserved u16, handle u32, request id u64`` (16 bytes)
========  ===================================================================================

Requests: :data:`OPEN` names what a handle looks up (its body: the JSON of a :class:`HandleSpec`,
sent once per table and shape on a stream, never per lookup); :data:`LOOKUP` carries the keys of
one request as one encapsulated Arrow IPC record batch of the handle's key schema (``limit``: most
rows of a prefix lookup, ``-1`` none). Replies: :data:`OPENED` (the handle's key schema and row
schema, Arrow IPC), :data:`ROWS` (one IPC record batch of the row schema; a large answer comes in
several parts, each but the last flagged :data:`MORE`: a request is answered when its last part
arrived, never before), :data:`ERROR` (a status code and a message; the request is over, the
stream goes on) and :data:`GOAWAY` (the server is shutting down: it answers what it already read,
the client sends nothing more and half-closes the stream).

Nothing here names "the" server: a client may hold one stream per server (a cluster's leaders);
handles and request ids are per stream. A handle opened ``routed`` (a client that sends each key to
its bucket's leader) is served from the buckets the server leads only: a key of another bucket
fails the request with :data:`NOT_LEADER` (the client's locations are stale: it asks them again and
resends), never with a partial answer; an unrouted handle's keys are forwarded by the server.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyarrow import flight

__all__ = [
    "ERROR", "GOAWAY", "KEY_INDEX_COLUMN", "LOOKUP", "MORE", "NOT_LEADER", "OPEN", "OPENED", "ROWS",
    "STALE_HANDLE", "STREAM_COMMAND", "HandleSpec", "MalformedMessage", "NotLeaderError", "decode_batch",
    "decode_error", "decode_reply", "decode_request", "decode_schemas", "encode_batch",
    "encode_error", "encode_reply", "encode_request", "encode_schemas", "error_code", "error_for",
]

STREAM_COMMAND = b"flightstore/lookup-stream/1"

OPEN, LOOKUP = 1, 2  # requests
OPENED, ROWS, ERROR, GOAWAY = 1, 2, 3, 4  # replies
MORE = 1  # reply flag: more ROWS parts of this request follow
#: The column a handle opened with ``key_index`` adds to its rows: the position (in the request's
#: keys) of the key each row answers, so a batch of many callers' keys can be split again.
KEY_INDEX_COLUMN = "__key_index"

_REQUEST = struct.Struct("<BBHIQq")
_REPLY = struct.Struct("<BBHIQ")
_LENGTH = struct.Struct("<I")


class MalformedMessage(ValueError):
    """A lookup-stream message that does not decode (the peer is not speaking this protocol)."""


@dataclass(frozen=True)
class HandleSpec:
    """What a handle looks up: ``kind`` ``lookup`` (by the whole primary key) or ``prefix`` (by
    the leading key columns ``key_columns``), which ``columns`` it answers (None: all), and
    whether rows carry :data:`KEY_INDEX_COLUMN`, and whether its keys are ``routed`` (each
    request's keys belong to buckets the server leads; see the module doc)."""

    table: str
    kind: str = "lookup"
    columns: tuple[str, ...] | None = None
    key_columns: tuple[str, ...] | None = None
    key_index: bool = False
    routed: bool = False

    def to_json(self) -> bytes:
        return json.dumps({"table": self.table, "kind": self.kind,
                           "columns": None if self.columns is None else list(self.columns),
                           "key_columns": None if self.key_columns is None else list(self.key_columns),
                           "key_index": self.key_index, "routed": self.routed}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | pa.Buffer) -> HandleSpec:
        """The spec of an OPEN body; :class:`MalformedMessage` naming what is wrong."""
        try:
            payload: Any = json.loads(bytes(data))
        except (ValueError, RecursionError) as exc:
            raise MalformedMessage(f"an OPEN body is a JSON object: {str(exc)[:200]}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("table"), str):
            raise MalformedMessage("an OPEN body names its 'table'")
        kind = payload.get("kind", "lookup")
        if kind not in ("lookup", "prefix"):
            raise MalformedMessage(f"an OPEN 'kind' is 'lookup' or 'prefix', not {kind!r}")
        lists = {}
        for name in ("columns", "key_columns"):
            value = payload.get(name)
            if value is not None and (not isinstance(value, list) or not all(isinstance(c, str) for c in value)):
                raise MalformedMessage(f"an OPEN {name!r} is a list of column names")
            lists[name] = None if value is None else tuple(value)
        if kind == "prefix" and not lists["key_columns"]:
            raise MalformedMessage("a prefix handle names its 'key_columns'")
        flags = {name: payload.get(name, False) for name in ("key_index", "routed")}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise MalformedMessage(f"an OPEN {name!r} is true or false")
        return cls(payload["table"], kind, lists["columns"], lists["key_columns"], flags["key_index"],
                   flags["routed"])


# ---- framing ---------------------------------------------------------------------------------------
def encode_request(kind: int, handle: int, request_id: int, body: Any = b"",
                   limit: int | None = None) -> bytes:
    """A request message (``body``: bytes or any buffer, e.g. a serialized batch)."""
    return b"".join((_REQUEST.pack(kind, 0, 0, handle, request_id, -1 if limit is None else limit),
                     memoryview(body)))


def decode_request(message: pa.Buffer) -> tuple[int, int, int, int | None, pa.Buffer]:
    """``(kind, handle, request id, limit or None, body)`` of a request message."""
    if message is None or message.size < _REQUEST.size:
        raise MalformedMessage("a lookup-stream request carries its header in app_metadata")
    kind, _, _, handle, request_id, limit = _REQUEST.unpack_from(message)
    if kind not in (OPEN, LOOKUP):
        raise MalformedMessage(f"unknown lookup-stream request kind {kind}")
    return kind, handle, request_id, (None if limit < 0 else limit), message.slice(_REQUEST.size)


def encode_reply(kind: int, handle: int, request_id: int, body: Any = b"", more: bool = False) -> bytes:
    return b"".join((_REPLY.pack(kind, MORE if more else 0, 0, handle, request_id), memoryview(body)))


def decode_reply(message: pa.Buffer) -> tuple[int, bool, int, int, pa.Buffer]:
    """``(kind, more, handle, request id, body)`` of a reply message."""
    if message is None or message.size < _REPLY.size:
        raise MalformedMessage("a lookup-stream reply carries its header in app_metadata")
    kind, flags, _, handle, request_id = _REPLY.unpack_from(message)
    if kind not in (OPENED, ROWS, ERROR, GOAWAY):
        raise MalformedMessage(f"unknown lookup-stream reply kind {kind}")
    return kind, bool(flags & MORE), handle, request_id, message.slice(_REPLY.size)


# ---- bodies ----------------------------------------------------------------------------------------
def encode_batch(batch: pa.RecordBatch) -> pa.Buffer:
    """One encapsulated IPC record batch message (no schema: both ends know it from OPENED)."""
    return batch.serialize()


def decode_batch(body: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of ``body``, checked against ``schema`` (buffers in bounds, offsets valid)."""
    try:
        batch = pa.ipc.read_record_batch(body, schema)
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as exc:
        raise MalformedMessage(f"a lookup-stream batch does not decode: {exc}") from None
    return batch


def encode_schemas(key_schema: pa.Schema, row_schema: pa.Schema) -> bytes:
    keys = key_schema.serialize()
    return b"".join((_LENGTH.pack(keys.size), memoryview(keys), memoryview(row_schema.serialize())))


def decode_schemas(body: pa.Buffer) -> tuple[pa.Schema, pa.Schema]:
    """``(key schema, row schema)`` of an OPENED body."""
    try:
        (length,) = _LENGTH.unpack_from(body)
        return (pa.ipc.read_schema(body.slice(_LENGTH.size, length)),
                pa.ipc.read_schema(body.slice(_LENGTH.size + length)))
    except (pa.ArrowException, struct.error, OSError) as exc:
        raise MalformedMessage(f"an OPENED body does not decode: {exc}") from None


# ---- errors ----------------------------------------------------------------------------------------
class NotLeaderError(flight.FlightUnavailableError):
    """A routed lookup reached a server that does not lead a key's bucket (stale locations, a
    failover): the client asks the locations again and resends."""


#: Status codes of ERROR replies, and the exception each becomes at the client: the classes a
#: pyarrow Flight client raises for the same status on a DoGet (so callers catch the same errors).
_CODES: tuple[tuple[str, type[Exception]], ...] = (
    ("internal", flight.FlightInternalError),
    ("invalid_argument", pa.ArrowInvalid),
    ("not_found", pa.ArrowKeyError),
    ("unimplemented", pa.ArrowNotImplementedError),
    ("unauthenticated", flight.FlightUnauthenticatedError),
    ("unauthorized", flight.FlightUnauthorizedError),
    ("unavailable", flight.FlightUnavailableError),
    ("cancelled", flight.FlightCancelledError),
    ("timed_out", flight.FlightTimedOutError),
    ("stale_handle", flight.FlightInternalError),
    ("not_leader", NotLeaderError),
)
STALE_HANDLE = 9  # the table's columns changed since OPEN: open the handle again, then resend
NOT_LEADER = 10  # a routed request's key is of a bucket this server does not lead: ask the locations again


def error_code(exc: BaseException) -> int:
    """The status code of ``exc``: a server error as the server's one translation made it (a
    Flight error, or ``ArrowInvalid`` / ``KeyError`` / ``NotImplementedError`` for the statuses
    pyarrow has no Flight class for)."""
    for code, cls in ((4, flight.FlightUnauthenticatedError), (5, flight.FlightUnauthorizedError),
                      (6, flight.FlightUnavailableError), (7, flight.FlightCancelledError),
                      (8, flight.FlightTimedOutError), (1, pa.ArrowInvalid), (2, KeyError),
                      (3, NotImplementedError)):
        if isinstance(exc, cls):
            return code
    return 0


def error_for(code: int, message: str) -> Exception:
    """The exception a client raises for an ERROR reply."""
    cls = _CODES[code][1] if 0 <= code < len(_CODES) else flight.FlightInternalError
    return cls(message)


def encode_error(code: int, message: str) -> bytes:
    return bytes([code]) + message.encode("utf-8", "replace")


def decode_error(body: pa.Buffer) -> tuple[int, str]:
    data = body.to_pybytes()
    if not data:
        raise MalformedMessage("an ERROR reply carries a status code")
    return data[0], data[1:].decode("utf-8", "replace")
