"""Ticket and custom-command payloads of flightstore's Flight endpoints.

Flight SQL query tickets are ``TicketStatementQuery`` messages (wrapped in ``Any``) whose
``statement_handle`` is a small JSON document: the SQL, its parameters, the default database and
the partition (bucket). Tickets are stateless, so every endpoint can be read alone, by any client,
in any order. flightstore's own commands (the Python client's writes, lookups and subscriptions)
are JSON documents prefixed by :data:`CUSTOM_PREFIX`.

Small results computed while answering GetFlightInfo (point lookups, counts) travel *in* their
ticket (:func:`result_ticket`): ``RESULT_PREFIX``, 8 random bytes (so two equal results still have
distinct tickets, and CancelFlightInfo cancels only its own), a 16-byte tag, then the Arrow IPC
stream. DoGet then streams a ready table: no second plan, no second lookup, still no server-side
state. A result is data the ticket's holder was authorized to read, so it is bound to that user:
the tag is an HMAC-SHA256 (with a key only the server knows) of the user, the random bytes and
the stream. Presented by anyone else, or altered, it is :data:`UNKNOWN_TICKET`, exactly the
answer to a ticket the server never issued.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any

import pyarrow as pa

from flightstore.errors import InvalidInput
from flightstore.expressions import _decode_value, _encode_value
from flightstore.server import protocol

__all__ = [
    "CUSTOM_PREFIX",
    "FIELD_TYPES",
    "INLINE_RESULT_BYTES",
    "RESULT_PREFIX",
    "UNKNOWN_TICKET",
    "Command",
    "decode_custom",
    "decode_params",
    "decode_query_handle",
    "decode_result",
    "encode_custom",
    "encode_params",
    "is_custom",
    "is_result",
    "query_ticket",
    "result_ticket",
]

CUSTOM_PREFIX = b"flightstore/1 "
RESULT_PREFIX = b"flightstore/result "
INLINE_RESULT_BYTES = 64 * 1024  # larger results stay on the server (or are computed at DoGet)
_NONCE_BYTES = 8
_TAG_BYTES = 16
#: What DoGet answers for a ticket this server did not issue to the caller (never issued, altered,
#: or issued to another user): one answer, so a ticket's holder learns nothing of others' tickets.
UNKNOWN_TICKET = "this ticket was not issued by this server"
# Built once: pyarrow's defaults read os.environ on every writer (and allocate per reader).
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
_READ_OPTIONS = pa.ipc.IpcReadOptions()


def encode_params(params: list | None) -> list | None:
    return None if params is None else [_encode_value(v) for v in params]


def decode_params(params: list | None) -> list | None:
    if params is None:
        return None
    try:
        return [_decode_value(v) for v in params]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"malformed query parameters in the ticket: {exc}") from None


class Command(dict):
    """A decoded command or ticket payload: a missing field is InvalidInput naming it (not a
    KeyError), and every field :data:`FIELD_TYPES` knows was checked to have its type."""

    def __missing__(self, key: str) -> Any:
        raise InvalidInput(f"malformed flightstore command {self.get('op', '')!r}: it has no {key!r}")


_INT = (int,)
_NUMBER = (int, float)
#: The JSON types of the fields of flightstore's commands and query tickets (null is let through:
#: optional fields take their default; ``bool`` is never taken for an int).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "op": (str,), "table": (str,), "id": (str,), "db": (str,), "query": (str,),  # "sql": its op checks it
    "partition": _INT, "params": (list,), "columns": (list,), "writer_id": (str,), "sequence": _INT,
    "after_sequence": _INT, "keys": (dict,), "filter": (dict, str), "limit": _INT, "buckets": (list,),
    "bucket": _INT, "at": _INT, "start": (str, int, dict), "until": (dict,), "log_from": (dict,),
    "heartbeat_s": _NUMBER, "which": (str,), "timestamp_ms": _INT, "force": (bool,), "exact": (bool,),
    "peer": (bool,), "keys_ipc": (str,), "from_offset": _INT, "to_offset": _INT, "max_rows": _INT,
    "table_id": (str,), "epochs": (dict,), "server_id": _INT,
}


def _checked(payload: Any, what: str) -> Command:
    if not isinstance(payload, dict):
        raise InvalidInput(f"malformed {what}: not a JSON object")
    for key, value in payload.items():
        expected = FIELD_TYPES.get(key)
        if expected is None or value is None:  # null: the field's default (checked where used)
            continue
        types = expected
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise InvalidInput(f"malformed {what}: {key!r} must be {names}, not {type(value).__name__}")
        if key in ("columns",) and not all(isinstance(c, str) for c in value):
            raise InvalidInput(f"malformed {what}: 'columns' must be a list of column names")
        if key == "buckets" and not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
            raise InvalidInput(f"malformed {what}: 'buckets' must be a list of bucket numbers")
        if key in ("start", "until", "log_from") and isinstance(value, dict) and not all(
                (k == "timestamp" or k.isdigit()) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in value.items()):
            raise InvalidInput(f"malformed {what}: {key!r} must map bucket numbers (or 'timestamp') "
                               "to integers")
        if key == "keys" and not all(isinstance(c, list) for c in value.values()):
            raise InvalidInput(f"malformed {what}: 'keys' must map column names to lists of values")
    return Command(payload)


def encode_custom(payload: dict[str, Any]) -> bytes:
    return CUSTOM_PREFIX + json.dumps(payload, separators=(",", ":")).encode()


def is_custom(data: bytes) -> bool:
    return data.startswith(CUSTOM_PREFIX)


def decode_custom(data: bytes) -> Command:
    """The payload of a flightstore command (InvalidInput when it is not a JSON object with an
    ``op`` and well-typed fields)."""
    try:
        payload = json.loads(data[len(CUSTOM_PREFIX):])
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"malformed flightstore command: {str(exc)[:200]}") from None
    if not isinstance(payload, dict) or "op" not in payload:
        raise InvalidInput("malformed flightstore command: no 'op'")
    return _checked(payload, "flightstore command")


def query_ticket(payload: dict[str, Any]) -> bytes:
    """A Flight SQL ticket for a query partition (``TicketStatementQuery`` in ``Any``)."""
    handle = json.dumps(payload, separators=(",", ":")).encode()
    return protocol.pack_any(protocol.TicketStatementQuery(statement_handle=handle))


def decode_query_handle(handle: bytes) -> Command:
    try:
        payload = json.loads(handle)
    except (ValueError, RecursionError):
        raise InvalidInput("unknown or expired statement handle") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("sql"), str):
        raise InvalidInput("unknown or expired statement handle")
    return _checked(payload, "statement handle")


def _tag(key: bytes, owner: str | None, nonce: bytes, body: memoryview | bytes) -> bytes:
    # One-shot HMAC (OpenSSL's, no hmac object): a result ticket is tagged at GetFlightInfo and
    # checked at DoGet, on the lookup path. The message is the same as hmac.new + update's.
    message = b"".join(((owner or "").encode(), b"\0", nonce, body))
    return hmac.digest(key, message, hashlib.sha256)[:_TAG_BYTES]


def result_ticket(table: pa.Table, key: bytes, owner: str | None) -> bytes | None:
    """A ticket carrying ``table`` itself, bound to user ``owner`` (None: no authentication) with
    the server's ``key``; None when its IPC stream exceeds :data:`INLINE_RESULT_BYTES`. The stream
    is assembled from its messages (the schema's serialized once per schema, then each batch, then
    the end-of-stream marker): a point lookup's answer is built without a stream writer."""
    schema = _schema_message(table.schema)
    parts = [schema]
    size = len(schema) + len(_END_OF_STREAM)
    for batch in table.to_batches():
        message = batch.serialize()
        size += message.size
        if size > INLINE_RESULT_BYTES:
            return None
        parts.append(message)
    parts.append(_END_OF_STREAM)
    body = b"".join(parts)
    nonce = os.urandom(_NONCE_BYTES)
    return RESULT_PREFIX + nonce + _tag(key, owner, nonce, body) + body


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_SCHEMA_MESSAGES: dict[tuple, bytes] = {}  # a few result schemas (lookups ask for the same few)


def _schema_message(schema: pa.Schema) -> bytes:
    key = (schema, tuple(sorted(schema.metadata.items())) if schema.metadata else None)  # == ignores metadata
    message = _SCHEMA_MESSAGES.get(key)
    if message is None:
        message = schema.serialize().to_pybytes()
        if len(_SCHEMA_MESSAGES) >= 256:
            _SCHEMA_MESSAGES.clear()
        _SCHEMA_MESSAGES[key] = message
    return message


def is_result(data: bytes) -> bool:
    return data.startswith(RESULT_PREFIX)


def decode_result(data: bytes, key: bytes, owner: str | None) -> pa.Table:
    """The table a :func:`result_ticket` carries, when it was issued to ``owner`` with ``key``;
    InvalidInput(:data:`UNKNOWN_TICKET`) otherwise."""
    start = len(RESULT_PREFIX)
    nonce, tag = data[start:start + _NONCE_BYTES], data[start + _NONCE_BYTES:start + _NONCE_BYTES + _TAG_BYTES]
    body = pa.py_buffer(data)[start + _NONCE_BYTES + _TAG_BYTES:]
    if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, _tag(key, owner, nonce, memoryview(body))):
        raise InvalidInput(UNKNOWN_TICKET)
    try:
        return pa.ipc.open_stream(body, options=_READ_OPTIONS).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"malformed result ticket: {exc}") from None


def encode_table(table: pa.Table) -> str:
    """``table`` as base64 Arrow IPC, for a JSON payload (lookup keys keep their exact types)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def decode_table(text: str) -> pa.Table:
    try:
        return pa.ipc.open_stream(base64.b64decode(text)).read_all()
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise InvalidInput(f"malformed keys in the request: {exc}") from None
