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
    "INLINE_RESULT_BYTES",
    "RESULT_PREFIX",
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
    return None if params is None else [_decode_value(v) for v in params]


def encode_custom(payload: dict[str, Any]) -> bytes:
    return CUSTOM_PREFIX + json.dumps(payload, separators=(",", ":")).encode()


def is_custom(data: bytes) -> bool:
    return data.startswith(CUSTOM_PREFIX)


def decode_custom(data: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(data[len(CUSTOM_PREFIX):])
    except ValueError as exc:
        raise InvalidInput(f"malformed flightstore command: {exc}") from None
    if not isinstance(payload, dict) or "op" not in payload:
        raise InvalidInput("malformed flightstore command: no 'op'")
    return payload


def query_ticket(payload: dict[str, Any]) -> bytes:
    """A Flight SQL ticket for a query partition (``TicketStatementQuery`` in ``Any``)."""
    handle = json.dumps(payload, separators=(",", ":")).encode()
    return protocol.pack_any(protocol.TicketStatementQuery(statement_handle=handle))


def decode_query_handle(handle: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(handle)
    except ValueError:
        raise InvalidInput("unknown or expired statement handle") from None
    if not isinstance(payload, dict):
        raise InvalidInput("unknown or expired statement handle")
    return payload


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
    except (pa.ArrowInvalid, OSError) as exc:
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
