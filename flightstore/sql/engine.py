"""The embedded SQL engine (DuckDB) that runs residual SQL, bounded and stoppable.

One in-memory DuckDB per executor with a memory limit (``query.memory-limit``) and a spill
directory under the data directory (``query.spill-limit``), its configuration locked once opened
(``lock_configuration``: no SQL that reaches it can raise a limit or reopen external access); a
cursor (its own connection, its own registered inputs) per query. Inputs may be Arrow tables or
record batch readers (streamed scans: DuckDB pulls them batch by batch); results stream out batch
by batch. A watchdog thread interrupts the DuckDB work of every query whose
:class:`~flightstore.sql.control.QueryControl` says stop (cancelled, caller gone, deadline passed),
so a query stops even in the middle of a long batch.
"""

from __future__ import annotations

import collections
import logging
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import duckdb
import pyarrow as pa

from flightstore import memory
from flightstore.errors import Cancelled, FlightstoreError, ResourceExhausted, SqlError
from flightstore.sql.control import QueryControl

__all__ = ["WATCHDOG_INTERVAL_S", "InputRescanned", "SqlEngine"]

WATCHDOG_INTERVAL_S = 0.05
log = logging.getLogger("flightstore.sql.engine")
_VALUE_BYTES = 16  # a result value's estimated bytes (sizes result batches by their width)
_CONSUMED = "has already been consumed"


class InputRescanned(SqlError):
    """DuckDB scanned a streamed input twice (a plan that reads one table reference more than
    once); the caller runs the query again on materialized inputs."""


class _Input:
    """A streamed input's batches, remembering the first error the source raised (DuckDB only
    sees a failed stream; the caller gets the original error: DataLoss, Cancelled...)."""

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> None:
        self.error: BaseException | None = None
        self.reader = pa.RecordBatchReader.from_batches(schema, self._guarded(batches))

    def _guarded(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except BaseException as exc:
            self.error = exc
            raise


class SqlEngine:
    """DuckDB for residual SQL: memory-limited, spilling to ``spill_dir``, interruptible."""

    def __init__(self, memory_limit: int, spill_dir: str | Path | None = None,
                 spill_limit: int = 0) -> None:
        self.memory_limit = memory_limit
        self.spill_dir = None if spill_dir is None else Path(spill_dir)
        self.spill_limit = spill_limit
        self.stopped: collections.Counter[str] = collections.Counter()  # queries stopped, by reason
        self._db: duckdb.DuckDBPyConnection | None = None
        self._running: dict[int, tuple[duckdb.DuckDBPyConnection, QueryControl]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def _database(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._db is None:
                config = {"enable_external_access": False, "memory_limit": f"{self.memory_limit}B"}
                if self.spill_dir is not None and self.spill_limit > 0:
                    shutil.rmtree(self.spill_dir, ignore_errors=True)  # a crashed run's leftovers
                    config["temp_directory"] = str(self.spill_dir)
                    config["max_temp_directory_size"] = f"{self.spill_limit}B"
                # Locked last: no statement may change the limits above (SET memory_limit, threads,
                # temp_directory, enable_external_access...), nor unlock them again.
                config["lock_configuration"] = True
                self._db = duckdb.connect(config=config)
            return self._db

    def running(self) -> int:
        """How many queries are inside DuckDB now."""
        with self._lock:
            return len(self._running)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            db, self._db = self._db, None
            watchdog = self._watchdog
        if watchdog is not None:
            watchdog.join()  # no thread of ours may be left waiting when the process exits
        if db is not None:
            db.close()

    def schema(self, sql: str, inputs: Mapping[str, pa.Schema]) -> pa.Schema:
        """The result schema of ``sql`` (run on empty inputs)."""
        empty = {name: schema.empty_table() for name, schema in inputs.items()}
        run = self._run(sql, empty, None, 1, schema_only=True)
        try:
            return next(run)
        finally:
            run.close()

    def run(self, sql: str, inputs: Mapping[str, pa.Table | tuple[pa.Schema, Iterator[pa.RecordBatch]]],
            control: QueryControl | None = None, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream the result of ``sql``. An input is a table or a ``(schema, batches)`` stream,
        read once. Stops (Cancelled / DeadlineExceeded) as soon as ``control`` says so."""
        yield from self._run(sql, inputs, control, batch_rows)

    def _run(self, sql: str, inputs: Mapping, control: QueryControl | None, batch_rows: int,
             schema_only: bool = False) -> Iterator:
        cursor = self._database().cursor()
        streams = {}
        try:
            for name, data in inputs.items():
                if isinstance(data, tuple):
                    streams[name] = _Input(*data)
                    data = streams[name].reader
                cursor.register(name, data)
            self._enter(cursor, control)
            try:
                relation = cursor.sql(sql)
                # result batches within the read batch bytes: 65,536 rows of a wide result are GBs
                reader = relation.to_arrow_reader(
                    memory.rows_within(len(relation.columns) * _VALUE_BYTES, batch_rows))
                if schema_only:
                    yield reader.schema
                    return
                while True:
                    if control is not None:
                        control.check()
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                    yield batch
            except (duckdb.Error, pa.ArrowException, OSError) as exc:  # DuckDB's, through Arrow's reader
                raise self._error(exc, control, streams, inputs) from None
        finally:
            self._leave(cursor)
            cursor.close()

    def _enter(self, cursor: duckdb.DuckDBPyConnection, control: QueryControl | None) -> None:
        if control is None:
            return
        with self._lock:
            self._running[id(cursor)] = (cursor, control)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="flightstore-sql-watchdog",
                                                  daemon=True)
                self._watchdog.start()

    def _leave(self, cursor: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            entry = self._running.pop(id(cursor), None)
        if entry is not None and entry[1].reason is not None:
            self.stopped[entry[1].reason] += 1

    def _watch(self) -> None:
        """Interrupt the DuckDB work of every query that must stop (checked every
        :data:`WATCHDOG_INTERVAL_S`): a batch in progress ends within about that long."""
        while not self._closed.wait(WATCHDOG_INTERVAL_S):
            with self._lock:
                entries = list(self._running.values())
            for cursor, control in entries:
                try:
                    if control.reason is not None:
                        cursor.interrupt()
                except Exception:  # noqa: BLE001 - closed meanwhile; the watchdog must live on
                    log.debug("interrupting a query failed", exc_info=True)

    def _error(self, exc: BaseException, control: QueryControl | None, streams: dict,
               inputs: Mapping) -> FlightstoreError:
        for stream in streams.values():
            if isinstance(stream.error, FlightstoreError):
                return stream.error
        if control is not None and control.reason is not None:
            try:
                control.check()
            except FlightstoreError as stop:
                return stop
        message = str(exc)
        if isinstance(exc, duckdb.InterruptException) or "INTERRUPT Error" in message:
            return Cancelled("the query was interrupted")
        if isinstance(exc, duckdb.OutOfMemoryException) or "Out of Memory" in message:
            return ResourceExhausted(
                f"the query needs more memory than the server allows (query.memory-limit "
                f"{self.memory_limit:,} bytes, query.spill-limit {self.spill_limit:,} bytes of spill): "
                f"{engine_message(message, inputs)}")
        if _CONSUMED in message:
            return InputRescanned("the engine read an input twice")
        for stream in streams.values():
            if stream.error is not None:
                return SqlError(f"query failed: reading an input failed: {stream.error}")
        return SqlError(f"query failed: {engine_message(message, inputs)}")


def engine_message(message: str, inputs: Mapping) -> str:
    """DuckDB's message in one line of the user's terms: without what only the rewritten SQL has
    (its ``LINE 1: ...`` excerpt of SQL the user did not write, the ``"__t0"`` input names), the
    tuning advice of an out-of-memory error (the user cannot SET anything), and DuckDB's list of
    candidate functions (kilobytes for an operator): a type mismatch says which types met
    (:func:`_no_match`)."""
    mismatch = _NO_MATCH.search(message)
    if mismatch is not None:
        return _no_match(mismatch, message)
    kept = [line for line in message.splitlines() if line.strip()]
    cut = next((i for i, line in enumerate(kept)
                if line.startswith(("LINE ", "Possible solutions"))), len(kept))
    text = " ".join(kept[:cut])
    return re.sub(r'"?__t\d+"?(?: AS )?', "", text).strip()


_NO_MATCH = re.compile(r"No function matches the given name and argument types '(?P<name>.+?)\((?P<types>.*)\)'\.")
_CANDIDATE = re.compile(r'^\t"?(?P<name>[^"(]+)"?\((?P<params>.*)\) -> (?P<result>.+)$', re.M)
# DuckDB's type names as flightstore's SQL writes them.
_TYPE_NAMES = {"VARCHAR": "STRING", "INTEGER_LITERAL": "INTEGER", "STRING_LITERAL": "STRING", "BLOB": "BYTES",
               "TIMESTAMP WITH TIME ZONE": "TIMESTAMP_LTZ", "TIME WITH TIME ZONE": "TIME_TZ"}
_MAX_SIGNATURES = 3  # candidate signatures named in the message; more means "cast" is the advice


def _user_types(text: str) -> str:
    return ", ".join(_TYPE_NAMES.get(t.strip(), t.strip()) for t in text.split(",") if t.strip())


def _no_match(match: re.Match, message: str) -> str:
    """DuckDB's "No function matches ... Candidate functions: <a line per overload>" in one line:
    ``the operator + does not apply to STRING and INTEGER``, or for a function the few signatures
    it has."""
    name, types = match.group("name"), _user_types(match.group("types"))
    if not re.match(r"\w", name):  # an operator
        operands = types.split(", ")
        return (f"the operator {name} does not apply to {' and '.join(operands)}; cast "
                f"{'the operand' if len(operands) == 1 else 'an operand'} to a type it takes (CAST(x AS ...))")
    candidates = [f"{name}({_user_types(', '.join(p.split()[-1] for p in c.group('params').split(',') if p.strip()))})"
                  for c in _CANDIDATE.finditer(message)]
    takes = f"; it takes {' or '.join(candidates)}" if 0 < len(candidates) <= _MAX_SIGNATURES else ""
    return f"the function {name} does not take ({types}){takes}; cast the arguments (CAST(x AS ...))"
