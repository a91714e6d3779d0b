"""The client end of the lookup stream (:mod:`flightstore.wire.lookups`): one Flight DoExchange
per connection (per server), on which each lookup is one message each way.

:class:`LookupStream` is one open stream: requests are written by whoever submits them and answered
in order; a reader thread takes each answer off the wire and completes its future, so many requests
may be in flight at once (the lookuper pipelines batches), and a server's GOAWAY or death is seen at
once even by an idle client. A handle (table, kind, columns) is opened once per stream and learns
the key and row schemas; keys are cast to the key schema here, so the server decodes them as they
are.

:class:`LookupStreams` keeps a connection's current stream and opens a new one when it broke. A
request on a stream that broke (server killed or restarted, connection lost, GOAWAY) is sent once
more on a fresh stream; if that fails too, the lookup fails with ``FlightUnavailableError`` saying it
was not answered. An answer is whole or absent: its rows are decoded only when its last part came.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore.wire import lookups as wire
from flightstore.wire.point_keys import PointKeys

__all__ = ["KeysDoNotFit", "LookupStream", "LookupStreams", "StaleHandle", "StreamBroken"]

ATTEMPTS = 2  # a request whose stream broke is sent once more, on a new stream
RETRY_PAUSE_S = 0.2  # ... after this pause (a restarting server, a connection being re-established)


class StreamBroken(Exception):
    """The stream ended before answering this request (``cause``: why, when known)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class KeysDoNotFit(Exception):
    """The keys lack a key column or hold a value the key type cannot take: the caller sends them
    the DoGet way instead, where the server names what is wrong as it always has."""


class StaleHandle(Exception):
    """The handle's table changed shape since it was opened: open it again and resend."""


@dataclass
class _Opened:
    handle: int
    key_schema: pa.Schema
    row_schema: pa.Schema
    point: PointKeys | None = None  # writes a single key of integer columns without a batch


#: What :meth:`LookupStream.send` calls with a request's answer: ``(rows, None)`` (one
#: RecordBatch when the answer came in one part, else a Table of its parts) or ``(None, error)``.
Answered = Callable[[Any, BaseException | None], None]


@dataclass
class _Request:
    future: Future | None  # None: a request sent with a callback (``answered``)
    row_schema: pa.Schema | None  # None: an OPEN (its answer is the schemas)
    spec: wire.HandleSpec
    parts: list[pa.RecordBatch] = field(default_factory=list)
    answered: Answered | None = None

    def succeed(self, value: Any) -> None:
        if self.answered is not None:
            self.answered(value, None)
        else:
            self.future.set_result(value)

    def fail(self, error: BaseException) -> None:
        if self.answered is not None:
            self.answered(None, error)
        elif not self.future.done():
            self.future.set_exception(error)


class LookupStream:
    """One open lookup stream to one server (thread-safe)."""

    def __init__(self, client: flight.FlightClient, options: flight.FlightCallOptions, uri: str) -> None:
        self.uri = uri
        self._writer, self._reader = client.do_exchange(
            flight.FlightDescriptor.for_command(wire.STREAM_COMMAND), options)
        self._ids = itertools.count(1)
        self._handle_ids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._handles: dict[wire.HandleSpec, Future] = {}  # -> _Opened
        self._lock = threading.Lock()  # pending and handles (the reader thread takes only this one)
        self._write_lock = threading.Lock()  # writes, half-close
        self._writable = True  # False after GOAWAY, close or breakage: nothing more is written
        self.broken: StreamBroken | None = None  # set when the stream can answer nothing more
        self._thread = threading.Thread(target=self._read_loop, name="flightstore-lookup-stream", daemon=True)
        self._thread.start()

    # ---- requests -----------------------------------------------------------------------------
    def opened(self, spec: wire.HandleSpec, timeout: float | None = None) -> _Opened:
        """The open handle of ``spec`` (opening it costs one round trip, once per stream)."""
        with self._lock:
            opening = self._handles.get(spec)
            if opening is None or (opening.done() and opening.exception() is not None):
                opening = self._handles[spec] = Future()
                handle = next(self._handle_ids)
                request_id = next(self._ids)
                self._pending[request_id] = _Request(opening, None, spec)
                message = wire.encode_request(wire.OPEN, handle, request_id, spec.to_json())
            else:
                message = None
        if message is not None:
            self._write(message, request_id)
        return opening.result(timeout)

    def submit(self, opened: _Opened, spec: wire.HandleSpec, keys: pa.RecordBatch | bytes,
               limit: int | None = None) -> Future:
        """Send ``keys`` (a batch of the key schema of ``opened``, the handle of ``spec``, or
        its encoded message); the future answers a Table of the handle's row schema, or raises
        the server's error, StaleHandle or StreamBroken."""
        future: Future = Future()
        self._send(_Request(future, opened.row_schema, spec), opened, keys, limit)
        return future

    def send(self, opened: _Opened, spec: wire.HandleSpec, keys: pa.RecordBatch, answered: Answered) -> None:
        """:meth:`submit` without a Future: ``answered(rows, None)`` or ``answered(None, error)``
        is called once, in the stream's reader thread (or in this one, when the stream cannot take
        the request). ``rows`` is the answer's one RecordBatch (a Table of its parts when it came
        in several): no Future, its Condition and its callback list per request, and no Table
        made of a single batch (the lookuper's requests; measured per 32-key request)."""
        self._send(_Request(None, opened.row_schema, spec, answered=answered), opened, keys, None)

    def _send(self, request: _Request, opened: _Opened, keys: pa.RecordBatch | bytes, limit: int | None) -> None:
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = request
        body = keys if isinstance(keys, bytes) else wire.encode_batch(keys)
        self._write(wire.encode_request(wire.LOOKUP, opened.handle, request_id, body, limit), request_id)

    def _write(self, message: bytes, request_id: int) -> None:
        """Write one request; if the stream cannot take it, its future fails with StreamBroken."""
        with self._write_lock:
            if self._writable:
                try:
                    self._writer.write_metadata(pa.py_buffer(message))
                    return
                except (pa.ArrowException, OSError) as exc:
                    self._writable = False
                    failure = StreamBroken(f"the lookup stream to {self.uri} broke: {exc}", exc)
            else:
                failure = self.broken or StreamBroken(f"the lookup stream to {self.uri} is closing")
        with self._lock:
            request = self._pending.pop(request_id, None)
        if request is not None:
            request.fail(failure)

    # ---- answers (the reader thread) ----------------------------------------------------------
    def _read_loop(self) -> None:
        cause: BaseException | None = None
        try:
            while True:
                try:
                    chunk = self._reader.read_chunk()
                except StopIteration:
                    break
                self._dispatch(chunk.app_metadata)
        except BaseException as exc:  # noqa: BLE001 - whatever ended the stream fails its requests
            cause = exc
        self._fail_all(cause)

    def _dispatch(self, message: pa.Buffer) -> None:
        kind, more, handle, request_id, body = wire.decode_reply(message)
        if kind == wire.GOAWAY:
            threading.Thread(target=self.close_writing, name="flightstore-lookup-goaway", daemon=True).start()
            return
        with self._lock:
            request = self._pending.get(request_id)
            if request is None:
                return  # a request the caller gave up on (its timeout passed)
            if kind == wire.ROWS and more:
                request.parts.append(wire.decode_batch(body, request.row_schema))
                return
            del self._pending[request_id]
            if kind == wire.ERROR:
                code, text = wire.decode_error(body)
                if request.row_schema is not None and code == wire.STALE_HANDLE:
                    self._handles.pop(request.spec, None)
        if kind == wire.OPENED:
            key_schema, row_schema = wire.decode_schemas(body)
            request.succeed(_Opened(handle, key_schema, row_schema, PointKeys.of(key_schema)))
        elif kind == wire.ROWS:
            rows = wire.decode_batch(body, request.row_schema)
            if request.answered is None or request.parts:
                request.parts.append(rows)
                rows = pa.Table.from_batches(request.parts, request.row_schema)
            request.succeed(rows)
        elif code == wire.STALE_HANDLE:
            request.fail(StaleHandle(text))
        else:
            request.fail(wire.error_for(code, text))

    def _fail_all(self, cause: BaseException | None) -> None:
        why = f": {cause}" if cause is not None else " (the server ended it)"
        broken = StreamBroken(f"the lookup stream to {self.uri} ended before answering{why}", cause)
        with self._write_lock:
            self._writable = False
            self.broken = broken
            if cause is not None:
                try:  # closed here, it reports nothing more (left to its destructor, it logs)
                    self._writer.close()
                except (pa.ArrowException, OSError):
                    pass
        with self._lock:
            pending, self._pending = self._pending, {}
        for request in pending.values():
            request.fail(broken)

    # ---- ending -------------------------------------------------------------------------------
    def close_writing(self) -> None:
        """Send nothing more; the server answers what it read, then ends the stream."""
        with self._write_lock:
            if not self._writable:
                return
            self._writable = False
            try:
                self._writer.done_writing()
            except (pa.ArrowException, OSError):
                pass

    def close(self, timeout: float = 10.0) -> None:
        """Half-close, wait for the answers in flight (at most ``timeout`` s), then end."""
        self.close_writing()
        self._thread.join(timeout)
        try:
            self._writer.close()
        except (pa.ArrowException, OSError):
            pass


class LookupStreams:
    """A connection's lookup stream to its server, opened on first use and again after it broke.

    ``open_stream`` opens a new :class:`LookupStream`; ``reauthenticate`` (None without
    credentials) mints a new token when the server refused the current one."""

    def __init__(self, open_stream: Callable[[], LookupStream],
                 reauthenticate: Callable[[], None] | None, timeout: float | None) -> None:
        self._open_stream = open_stream
        self._reauthenticate = reauthenticate
        self.timeout = timeout
        self._stream: LookupStream | None = None
        self._lock = threading.Lock()

    def current(self) -> LookupStream:
        """The open stream (a new one when there is none, or it broke or is going away);
        StreamBroken when none can be opened."""
        with self._lock:
            stream = self._stream
            if stream is None or stream.broken is not None or not stream._writable:
                self._stream = None
                try:
                    stream = self._open_stream()
                except (pa.ArrowException, OSError) as exc:  # the server cannot be reached
                    raise StreamBroken(f"no lookup stream could be opened: {exc}", exc) from exc
                self._stream = stream
            return stream

    def key_schema(self, spec: wire.HandleSpec) -> pa.Schema:
        """The key schema of ``spec``'s handle (opening it on the current stream; retried once on
        a new stream when the stream broke)."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return self.current().opened(spec, self.timeout).key_schema
            except StreamBroken as exc:
                if attempt == ATTEMPTS:
                    raise unanswered(spec.table, exc) from exc
            except TimeoutError:
                raise flight.FlightTimedOutError(f"no answer to opening a lookup in {spec.table} "
                                                 f"within {self.timeout} s") from None
        raise AssertionError("unreachable")

    def call(self, spec: wire.HandleSpec, keys: Any, limit: int | None = None) -> pa.Table:
        """The answer to one lookup request (``keys``: see :func:`key_batch`),
        retried once on a new stream when its stream broke. Raises the server's error as DoGet
        would, ``FlightUnavailableError`` when the lookup could not be answered, or
        ``FlightTimedOutError`` past the connection's timeout."""
        stale = 0
        attempt = 0
        while True:
            stream = None
            try:
                stream = self.current()
                opened = stream.opened(spec, self.timeout)
                batch = opened.point.encode(keys) if opened.point is not None and isinstance(keys, dict) else None
                if batch is None:
                    try:
                        batch = key_batch(keys, opened.key_schema)
                    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
                        raise KeysDoNotFit(str(exc)) from exc
                future = stream.submit(opened, spec, batch, limit)
                return future.result(self.timeout)
            except StaleHandle:
                stale += 1
                if stale > 3:
                    raise flight.FlightInternalError(f"table {spec.table} keeps changing shape; "
                                                     "the lookup was not answered") from None
            except TimeoutError:
                raise flight.FlightTimedOutError(f"no answer to a lookup in {spec.table} from "
                                                 f"{stream.uri} within {self.timeout} s") from None
            except StreamBroken as exc:
                attempt += 1
                cause = exc.cause
                if isinstance(cause, flight.FlightUnauthenticatedError) and self._reauthenticate is not None:
                    self._reauthenticate()
                elif attempt >= ATTEMPTS:
                    raise unanswered(spec.table, exc) from exc
                else:
                    time.sleep(RETRY_PAUSE_S)

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def key_batch(keys: Any, key_schema: pa.Schema) -> pa.RecordBatch:
    """``keys`` (a dict of columns, a Table or a RecordBatch holding the key columns; others are
    ignored) as one batch of ``key_schema``: the server decodes it as it is. KeyError (a key
    column missing), ValueError, TypeError or ``pa.ArrowException`` (a null, a value that does not
    convert) say the keys do not fit."""
    if isinstance(keys, dict):  # the common case: built straight in the key types, no cast
        arrays = [pa.array(keys[f.name], f.type) for f in key_schema]
        if any(a.null_count for a in arrays):
            raise ValueError("a key column holds a null")
        return pa.RecordBatch.from_arrays(arrays, schema=key_schema)
    table = keys if isinstance(keys, pa.Table) else pa.Table.from_batches([keys])
    table = table.select(key_schema.names)
    if not table.schema.equals(key_schema):
        table = table.cast(key_schema)
    batches = table.combine_chunks().to_batches()
    if batches:
        return batches[0]  # combined: one batch
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in key_schema], schema=key_schema)


def unanswered(table: str, broken: StreamBroken) -> BaseException:
    """The error of a lookup whose stream broke on every attempt: the server's own error when the
    stream ended with one (UNAUTHENTICATED, UNAUTHORIZED, INVALID_ARGUMENT), else UNAVAILABLE."""
    cause = broken.cause
    if isinstance(cause, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError,
                          pa.ArrowInvalid, KeyError, NotImplementedError)):
        return cause
    return flight.FlightUnavailableError(f"a lookup in {table} was not answered: {broken}")
