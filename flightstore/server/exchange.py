"""DoExchange: the lookup stream (:mod:`flightstore.wire.lookups`), a long-lived stream per client
connection on which each lookup is one message each way.

A stream opens **handles** (a table, a lookup kind, the columns to answer): opening one resolves the
table, checks the caller's READ grant on it and answers the key and row schemas, once. A lookup
then names its handle and carries its keys as one Arrow batch: no JSON, no SQL, no new gRPC call.
The grant is checked again on every lookup (a REVOKE holds at once; the check is a set lookup), and
a handle whose table changed shape since it was opened (ALTER TABLE, a table dropped and created
again) answers STALE_HANDLE, so the client opens it again and never decodes rows against the old
schema. A failed lookup answers an ERROR with the status the same failure has on DoGet, and the
stream goes on; a malformed message ends the stream with INVALID_ARGUMENT.

Each stream holds one gRPC call (and one server thread) for as long as the client keeps it. On
shutdown the server sends every open stream GOAWAY: the client sends nothing more, reads the
answers to what it already sent, and half-closes; the call then ends and shutdown can finish.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from flightstore.acl import Operation, Permission
from flightstore.catalog import DEFAULT_DATABASE
from flightstore.errors import DatabaseNotFound, InvalidInput, NotLeader, TableNotFound, Unavailable, Unsupported
from flightstore.schema import TablePath
from flightstore.server.coalesce import LookupCoalescer, matchable_keys
from flightstore.server.messages import MAX_BATCH_BYTES, MAX_BATCH_ROWS, rechunk
from flightstore.server.point_lookups import PointPath, point_reply
from flightstore.server.rpc import _CALLER, _translate
from flightstore.sql.privileges import table_resource
from flightstore.wire import lookups as wire

__all__ = ["LookupStreamRpcs", "LookupStreams"]

MAX_HANDLES = 1024  # handles one stream may hold open (a client opens one per table and shape)


class LookupStreamRpcs:
    """DoExchange of :class:`~flightstore.server.service.FlightSqlServer` (mixed into it: ``self``
    is the server, with its store, authorizer, metrics and :attr:`lookup_streams`)."""

    def _lookup_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                         reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        """A client's lookup stream (the server's ``do_exchange`` dispatches here)."""
        if descriptor.descriptor_type != flight.DescriptorType.CMD or \
                descriptor.command != wire.STREAM_COMMAND:
            raise Unsupported("DoExchange serves flightstore's lookup stream only (command "
                              f"{wire.STREAM_COMMAND.decode()!r})")
        stream = ServedLookupStream(self, writer)
        self.lookup_streams.add(stream)
        try:
            if self._stop.is_set():  # shutdown began before this stream was registered
                raise Unavailable("the server is shutting down")
            stream.serve(reader)
        finally:
            self.lookup_streams.discard(stream)


class LookupStreams:
    """The open lookup streams of a server, so that shutdown can send each GOAWAY, and the queue
    their point lookups run together in (:mod:`.coalesce`)."""

    def __init__(self) -> None:
        self._streams: set[ServedLookupStream] = set()
        self._lock = threading.Lock()
        self.coalescer = LookupCoalescer()

    def add(self, stream: ServedLookupStream) -> None:
        with self._lock:
            self._streams.add(stream)

    def discard(self, stream: ServedLookupStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def go_away(self) -> None:
        """Tell every open stream the server is shutting down (see the module doc)."""
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.go_away()


@dataclass(frozen=True)
class _Handle:
    """An open handle: what its spec resolved to when it was opened (or last refreshed)."""

    spec: wire.HandleSpec
    path: Any  # TablePath
    key_columns: tuple[str, ...]
    columns: tuple[str, ...]  # the row columns answered
    fetch: tuple[str, ...]  # what is read: the row columns, plus the key columns for key_index
    key_schema: pa.Schema
    row_schema: pa.Schema
    permissions: tuple[Permission, ...]
    catalog_version: int
    name: str  # str(path), the metrics' table label (formatted once, not per lookup)
    point: PointPath | None = None  # its single-key lookups' path without Arrow (.point_lookups)


class _Stale(Exception):
    """The handle's table changed shape since OPEN (answered as STALE_HANDLE)."""


class ServedLookupStream:
    """One client's lookup stream: its handles, and the loop answering its requests in order."""

    def __init__(self, server: Any, writer: flight.MetadataRecordBatchWriter) -> None:
        self.server = server
        self.store = server.store
        self.caller = _CALLER.get()  # the stream's user: _rpc set it for the whole call
        self.handles: dict[int, _Handle] = {}
        self._writer = writer
        self._write_lock = threading.Lock()
        self._gone = False

    def serve(self, reader: flight.MetadataRecordBatchReader) -> None:
        """Answer requests until the client half-closes the stream.

        Once this returns, gRPC finishes the call and its writer must never be used again: the stream
        is marked gone under the write lock first, so a GOAWAY sent by shutdown from another thread
        either lands while the call is open or is not sent (writing to a finished call aborts the
        process)."""
        try:
            self._answer(reader)
        finally:
            with self._write_lock:
                self._gone = True

    def _answer(self, reader: flight.MetadataRecordBatchReader) -> None:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            try:
                kind, handle_id, request_id, limit, body = wire.decode_request(chunk.app_metadata)
            except wire.MalformedMessage as exc:
                raise InvalidInput(f"malformed lookup-stream message: {exc}") from None
            started = time.perf_counter()
            try:
                if kind == wire.OPEN:
                    replies = [self._open(handle_id, request_id, body)]
                else:
                    replies = self._lookup(handle_id, request_id, body, limit)
            except _Stale as exc:
                replies = [wire.encode_reply(wire.ERROR, handle_id, request_id,
                                             wire.encode_error(wire.STALE_HANDLE, str(exc)))]
            except NotLeader as exc:  # a routed request whose sender's locations are stale
                replies = [wire.encode_reply(wire.ERROR, handle_id, request_id,
                                             wire.encode_error(wire.NOT_LEADER, str(exc)))]
            except Exception as exc:  # noqa: BLE001 - the request fails, the stream goes on
                translated = _translate(exc, self.server._hidden_paths)
                replies = [wire.encode_reply(wire.ERROR, handle_id, request_id,
                                             wire.encode_error(wire.error_code(translated), str(translated)))]
            with self._write_lock:
                for reply in replies:
                    self._writer.write_metadata(pa.py_buffer(reply))
            if kind != wire.OPEN:
                self.server.metrics.lookups.observe(time.perf_counter() - started)

    def go_away(self) -> None:
        with self._write_lock:
            if self._gone:
                return
            self._gone = True
            try:
                self._writer.write_metadata(pa.py_buffer(wire.encode_reply(wire.GOAWAY, 0, 0)))
            except (pa.ArrowException, OSError):
                pass  # the stream is ending anyway

    # ---- requests -----------------------------------------------------------------------------
    def _open(self, handle_id: int, request_id: int, body: pa.Buffer) -> bytes:
        try:
            spec = wire.HandleSpec.from_json(body)
        except wire.MalformedMessage as exc:
            raise InvalidInput(f"malformed lookup-stream OPEN: {exc}") from None
        if handle_id not in self.handles and len(self.handles) >= MAX_HANDLES:
            raise InvalidInput(f"a lookup stream holds at most {MAX_HANDLES} handles; reuse them")
        handle = self._resolve(spec)
        self.handles[handle_id] = handle
        return wire.encode_reply(wire.OPENED, handle_id, request_id,
                                 wire.encode_schemas(handle.key_schema, handle.row_schema))

    def _resolve(self, spec: wire.HandleSpec) -> _Handle:
        """What ``spec`` names now: the table (READ checked), its key columns and schemas."""
        version = self.store.catalog.version  # before resolving: a later change is seen next time
        path = TablePath.parse(spec.table, DEFAULT_DATABASE) if isinstance(spec.table, str) else spec.table
        authz = self.server.authz
        if not authz.is_super(self.caller):  # a hidden table answers exactly like an absent one
            if not authz.sees_database(self.caller, path.database):
                raise DatabaseNotFound(f"database {path.database!r} does not exist")
            if not authz.sees_table(self.caller, path):
                raise TableNotFound(f"table {path} does not exist")
        table = self.store.table(path)
        permissions = (Permission(Operation.READ, table_resource(table.path)),)
        self.server.authz.check(self.caller, permissions)
        descriptor = table.descriptor
        if not descriptor.has_primary_key:
            raise Unsupported(f"{'lookup' if spec.kind == 'lookup' else 'prefix lookup'} needs a "
                              f"primary-key table; {table.path} is a log table")
        key = tuple(descriptor.primary_key)
        if spec.kind == "lookup":
            if spec.key_columns is not None and tuple(spec.key_columns) != key:
                raise InvalidInput(f"a lookup in {table.path} is by its primary key {list(key)}, "
                                   f"not {list(spec.key_columns)}")
            key_columns = key
        else:
            key_columns = tuple(spec.key_columns)
            width = len(key_columns)
            if key_columns != key[:width] or width < len(descriptor.bucket_key):
                raise InvalidInput(
                    f"a prefix lookup on {table.path} needs the leading primary key columns "
                    f"{list(key[:max(width, len(descriptor.bucket_key))])} (bucket key "
                    f"{list(descriptor.bucket_key)}), got {list(key_columns)}")
        names = table.schema.names
        columns = tuple(names) if spec.columns is None else tuple(spec.columns)
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise InvalidInput(f"table {table.path} has no column {unknown[0]!r}")
        fetch = columns + tuple(c for c in key_columns if c not in columns) if spec.key_index else columns
        row_schema = table.projection(columns)
        if spec.key_index:
            row_schema = row_schema.append(pa.field(wire.KEY_INDEX_COLUMN, pa.int32(), nullable=False))
        key_schema = pa.schema([table.schema.field(c) for c in key_columns])
        return _Handle(spec, table.path, key_columns, columns, fetch, key_schema, row_schema,
                       permissions, version, str(table.path), PointPath.of(spec, key_schema, row_schema))

    def _current(self, handle_id: int) -> _Handle:
        handle = self.handles.get(handle_id)
        if handle is None:
            raise InvalidInput(f"handle {handle_id} is not open on this lookup stream")
        self.server.authz.check(self.caller, handle.permissions)  # a REVOKE holds at once
        if self.store.catalog.version != handle.catalog_version:  # some DDL since: same shape?
            fresh = self._resolve(handle.spec)
            if not (fresh.key_schema.equals(handle.key_schema) and fresh.row_schema.equals(handle.row_schema)):
                del self.handles[handle_id]
                raise _Stale(f"table {handle.spec.table} changed since this lookup handle was opened")
            handle = self.handles[handle_id] = fresh
        return handle

    def _lookup(self, handle_id: int, request_id: int, body: pa.Buffer, limit: int | None) -> list[bytes]:
        handle = self._current(handle_id)
        if handle.point is not None:
            reply = point_reply(self.server, handle, handle_id, request_id, body)
            if reply is not None:
                return [reply]
        try:
            keys = wire.decode_batch(body, handle.key_schema)
        except wire.MalformedMessage as exc:
            raise InvalidInput(f"malformed lookup keys: {exc}") from None
        table = self.store.table(handle.path)
        keys = pa.Table.from_batches([keys])
        if handle.spec.routed and table.distributed and not table.descriptor.is_partitioned:
            table = table.led_here(keys)  # this server's own buckets, or NOT_LEADER: never forwarded
        positions = None
        if handle.spec.kind == "lookup" and keys.num_rows == 1:
            # A single key runs here, in this stream's thread: under load, joining the queue of
            # .coalesce cost ~2x the server CPU per lookup (the hand-over wake-ups and the grouping
            # cost more than the point lookup they share; measured with 8 client streams).
            found = table.lookup(keys, list(handle.fetch))
            if handle.spec.key_index:
                positions = np.zeros(found.num_rows, dtype=np.int32)
        elif handle.spec.kind == "lookup":  # with the lookups of other streams (.coalesce)
            found, positions = self.server.lookup_streams.coalescer.lookup(
                table, handle.key_columns, handle.fetch, keys)
        else:
            found = table.prefix_lookup(keys, handle.fetch, limit)
        if handle.spec.key_index:
            if positions is None:
                positions = _positions(found, keys, handle.key_columns, handle.spec.kind == "lookup")
            # int32 as the column is: numpy's astype, or no cast at all (index_in answers int32),
            # costs a tenth of a compute cast per request
            if isinstance(positions, np.ndarray) and len(positions) == keys.num_rows:
                # every key found (the positions of a point lookup rise, each key once): 0..n-1
                positions = _in_key_order(len(positions))
            elif isinstance(positions, np.ndarray):  # its buffer as it is (pa.array of numpy goes
                # through pyarrow's pandas conversion: a few us per request)
                positions = pa.Array.from_buffers(pa.int32(), len(positions), [
                    None, pa.py_buffer(np.ascontiguousarray(positions, dtype=np.int32))])
            elif positions.type != pa.int32():
                positions = positions.cast(pa.int32())
            found = found.select(list(handle.columns)).append_column(
                handle.row_schema.field(wire.KEY_INDEX_COLUMN), positions)
        if not found.schema.equals(handle.row_schema):
            found = found.cast(handle.row_schema)
        self.server.metrics.sent(handle.name, found)
        parts = found.to_batches()
        max_rows = min(MAX_BATCH_ROWS, self.server.max_batch_rows)  # server.max-batch-rows
        if len(parts) != 1 or (found.num_rows > 1 and (  # one row cannot be cut smaller
                found.num_rows > max_rows or found.get_total_buffer_size() > MAX_BATCH_BYTES)):
            parts = [batch for part in rechunk(iter([found]), max_rows) for batch in part.to_batches()] or \
                [pa.RecordBatch.from_arrays([pa.array([], f.type) for f in handle.row_schema],
                                            schema=handle.row_schema)]
        return [wire.encode_reply(wire.ROWS, handle_id, request_id, wire.encode_batch(batch),
                                  more=i < len(parts) - 1)
                for i, batch in enumerate(parts)]


@functools.lru_cache(maxsize=1024)
def _in_key_order(n: int) -> pa.Array:
    """The key-index column of an answer that found each of its ``n`` keys, in their order:
    0..n-1 as int32, made once per ``n`` (building it from numpy per request cost ~6 us, a
    GIL-held pyarrow call among the fewer than ten of a batched request's answer). Arrays are
    immutable: every answer of ``n`` rows shares it."""
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.arange(n, dtype=np.int32))])


def _positions(found: pa.Table, keys: pa.Table, key_columns: tuple[str, ...],
               point: bool) -> pa.Array | np.ndarray:
    """For each row of ``found``, the index of its key's first occurrence in ``keys`` (the client
    asks each key once), matched on :func:`~.coalesce.matchable_keys` (no encoding for a key of
    one integer column: encoding both sides cost ~1 us per key of a 128-key lookup). When a
    ``point`` lookup (one row per key at most, unlike a prefix's) found every one of its distinct
    integer keys, the rows are the keys' in their order: no match."""
    if point and found.num_rows == keys.num_rows and len(key_columns) == 1 and \
            pa.types.is_integer(keys.schema.field(key_columns[0]).type):
        asked = keys.column(key_columns[0]).to_numpy()
        if len(np.unique(asked)) == len(asked):
            return np.arange(len(asked), dtype=np.int32)
    return pc.index_in(matchable_keys(found, key_columns), value_set=matchable_keys(keys, key_columns))
