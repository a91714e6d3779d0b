"""Ticket and custom-command payloads of flightstore's Flight endpoints.

Flight SQL query tickets are ``TicketStatementQuery`` messages (wrapped in ``Any``) whose
``statement_handle`` is a small JSON document: the SQL, its parameters, the default database and
the partition (bucket). Tickets are stateless, so every endpoint can be read alone, by any client,
in any order. flightstore's own commands (the Python client's writes, lookups and subscriptions)
are JSON documents prefixed by :data:`CUSTOM_PREFIX`.

Small results computed while answering GetFlightInfo (point lookups, counts) travel *in* their
ticket (:func:`result_ticket`): ``RESULT_PREFIX``, 8 random bytes (so two equal results still have
distinct tickets, and CancelFlightInfo cancels only its own), then the Arrow IPC stream. DoGet
then streams a ready table: no second plan, no second lookup, still no server-side state.
"""

from __future__ import annotations

import base64
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


def result_ticket(table: pa.Table) -> bytes | None:
    """A ticket carrying ``table`` itself, or None when its IPC stream exceeds
    :data:`INLINE_RESULT_BYTES`."""
    sink = pa.BufferOutputStream()
    sink.write(RESULT_PREFIX + os.urandom(_NONCE_BYTES))
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    if sink.tell() > len(RESULT_PREFIX) + _NONCE_BYTES + INLINE_RESULT_BYTES:
        return None
    return sink.getvalue().to_pybytes()


def is_result(data: bytes) -> bool:
    return data.startswith(RESULT_PREFIX)


def decode_result(data: bytes) -> pa.Table:
    """The table a :func:`result_ticket` carries."""
    body = pa.py_buffer(data)[len(RESULT_PREFIX) + _NONCE_BYTES:]
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
