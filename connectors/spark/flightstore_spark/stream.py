"""``spark.readStream.format("flightstore")``: a table's changelog as a Structured Streaming source.

Offsets are ``{"<bucket>": next_offset}`` (row offsets of each bucket's log). A micro-batch
``[start, end)`` is one Spark partition per bucket that moved, read on an executor with the
``subscribe`` command given explicit ``start`` and ``until`` offsets, so it ends by itself and a
replay after a restart reads exactly the same rows.

Options:

* ``startup.mode``: ``earliest`` (default: the earliest offset each bucket still holds) | ``latest`` |
  ``timestamp`` (with ``startup.timestamp``, epoch ms) | ``offsets`` (with ``startup.offsets``, JSON
  ``{"0": 12, ...}``; buckets left out start at the earliest offset; an offset the log no longer
  holds is an error naming the earliest one held) | ``full`` (primary-key tables: a KV snapshot as
  ``+I`` rows, then the changelog from exactly the snapshot's offsets; the first offset carries
  ``"snapshot": true``).
  On a datalake-enabled log table ``earliest`` starts with the lake: the first micro-batch reads
  the data files of the lake's current snapshot straight from the warehouse (one Spark partition
  per file; ``_log_offset`` / ``_commit_timestamp`` from the lake's ``__offset`` / ``__timestamp``)
  plus each bucket's log from the offset that snapshot tiered up to; the offset records the
  snapshot (``"lake": <snapshot id>``), so a replay reads the same files.
* ``maxRowsPerTrigger``: admission control, the lake part included. While a stream from
  ``earliest`` is in its lake part, an offset also records the position reached in it
  (``"lake_at": [<data file path>, <row>]``: the snapshot's data files in path order, every row
  before that one read): a micro-batch reads the next ``maxRowsPerTrigger`` lake rows, whole files
  or row ranges of a file larger than what is left (only the Parquet row groups holding them),
  and the log's micro-batches begin after the last lake row. A query restarted from its checkpoint
  replays and resumes at exactly these positions. In the log, the rows are spread over the buckets
  that have data.
* ``columns``: ``a,b`` to read only those table columns (the changelog columns always come along).

Rows carry ``_change_type`` (+I, -U, +U, -D; +A for log tables), ``_log_offset`` and
``_commit_timestamp``. In ``full`` mode the first micro-batch reads each bucket's rows exactly at
the bucket's end offset when the query started (the server's ``snapshot`` read: the newest KV
snapshot's columnar image at or below that offset merged with the changelog up to it, no fold of the
whole changelog) and the stream continues from that offset, so no change is missed or seen twice
even when the changelog before the snapshot has expired. Snapshot rows carry a null
``_log_offset`` and ``_commit_timestamp``. A replayed first micro-batch reads the same rows while a
snapshot at or below its offset is retained (``kv.snapshot.num-retained``), else it fails clearly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from flightstore_spark import _flight
from flightstore_spark.source import conform_batches

__all__ = ["FlightstoreStreamReader", "allot_rows", "lake_advance", "lake_ranges", "stream_columns"]

META_COLUMNS = ("_change_type", "_log_offset", "_commit_timestamp")
SNAPSHOT_KEY = "snapshot"
LAKE_KEY = "lake"
LAKE_AT_KEY = "lake_at"


def stream_columns(conn: Any, options: _flight.Options) -> list[str] | None:
    if not options.columns:
        return None
    return list(options.columns) + [c for c in META_COLUMNS if c not in options.columns]


def _buckets(offsets: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in offsets.items() if k not in (SNAPSHOT_KEY, LAKE_KEY, LAKE_AT_KEY)}


def _offset(buckets: dict[int, int], snapshot: bool = False) -> dict:
    result: dict[str, Any] = {str(b): int(o) for b, o in sorted(buckets.items())}
    if snapshot:
        result[SNAPSHOT_KEY] = True
    return result


def allot_rows(start: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """End offsets admitting at most ``max_rows`` rows, shared fairly over buckets with data."""
    pending = {b: max(0, end[b] - start.get(b, 0)) for b in end}
    result = {b: start.get(b, end[b]) for b in end}
    left = max_rows
    waiting = sorted((b for b in pending if pending[b] > 0), key=lambda b: (pending[b], b))
    for i, bucket in enumerate(waiting):
        share = left // (len(waiting) - i)
        take = min(pending[bucket], share)
        result[bucket] += take
        left -= take
    if left == max_rows and waiting and max_rows > 0:  # fewer rows than buckets: progress anyway
        result[waiting[-1]] += min(max_rows, pending[waiting[-1]])
    return result


# A lake data file as the stream sees it: (path, rows); a position in the lake part: (path, row).
LakeFile = tuple[str, int]
LakePosition = tuple[str, int]


def _first_row(path: str, at: LakePosition | None) -> int | None:
    """Where a read from ``at`` begins in file ``path`` (None: the file lies before ``at``)."""
    if at is None or path > at[0]:
        return 0
    return at[1] if path == at[0] else None


def lake_advance(files: Sequence[LakeFile], at: LakePosition | None, budget: int) -> LakePosition | None:
    """The position ``budget`` rows after ``at`` in ``files`` (sorted by path); None when those
    rows reach the end of the lake part."""
    for path, rows in files:
        first = _first_row(path, at)
        if first is None or first >= rows:
            continue
        if budget <= 0:
            return path, first
        take = min(rows - first, budget)
        budget -= take
        if first + take < rows:
            return path, first + take
    return None


def lake_ranges(files: Sequence[LakeFile], at: LakePosition | None,
                stop: LakePosition | None) -> list[tuple[str, int, int]]:
    """The row ranges ``(path, first, stop)`` of ``files`` (sorted by path) from position ``at``
    up to position ``stop`` (None: the end of the lake part)."""
    ranges = []
    for path, rows in files:
        first = _first_row(path, at)
        if first is None:
            continue
        last = rows
        if stop is not None:
            if path > stop[0]:
                break
            if path == stop[0]:
                last = min(rows, stop[1])
        if last > first:
            ranges.append((path, first, last))
    return ranges


def _lake_at(offset: dict) -> LakePosition | None:
    at = offset.get(LAKE_AT_KEY)
    return None if at is None else (str(at[0]), int(at[1]))


def _lake_changelog(split: dict, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Lake rows as changelog rows: ``+A``, ``_log_offset`` = ``__offset``, ``_commit_timestamp`` =
    ``__timestamp`` (read on the executor straight from the warehouse)."""
    meta = {"_log_offset": "__offset", "_commit_timestamp": "__timestamp"}
    wanted = [meta.get(c, c) for c in columns if c != "_change_type"]
    rows = split.get("rows")
    batches = _flight.read_lake_files(split["files"], split["io"], split["schema"], wanted) if rows is None else \
        _flight.read_lake_file_rows(split["files"][0], split["io"], split["schema"], wanted, rows[0], rows[1])
    for batch in batches:
        arrays = {c: batch.column(meta.get(c, c)) for c in columns if c != "_change_type"}
        arrays["_change_type"] = \
            pa.repeat(pa.scalar("+A", pa.string()), batch.num_rows)
        yield pa.RecordBatch.from_arrays([arrays[c] for c in columns], names=columns)


class FlightstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict, schema: StructType) -> None:
        self.options = _flight.Options(options)
        if not self.options.table:
            raise ValueError("a streaming flightstore read needs option('table', 'db.t')")
        self.schema = schema
        self.mode = str(self.options.get("startup.mode", "earliest")).lower()
        max_rows = self.options.get("maxRowsPerTrigger")
        self.max_rows = int(max_rows) if max_rows else None
        self._available_now: dict[int, int] | None = None
        self._lake_files: dict[int, list[LakeFile]] = {}  # by snapshot id
        with self.options.connect() as conn:
            self.primary_key = _flight.primary_key(conn, self.options.table)
        if self.mode == "full" and self.primary_key:
            missing = [c for c in self.primary_key if c not in schema.fieldNames()]
            if missing:
                raise ValueError(f"startup.mode=full needs the primary key columns {missing} in 'columns'")

    # ---- offsets (driver) ---------------------------------------------------------------------
    def _offsets(self, which: str = "end", **extra: Any) -> dict[int, int]:
        with self.options.connect() as conn:
            if which == "timestamp":
                answer = conn._action("flightstore.offsets", {"table": self.options.table,
                                                             "which": "timestamp", **extra})
                return {int(k): v for k, v in answer["offsets"].items()}
            return conn.table(self.options.table).offsets(which)

    def initialOffset(self) -> dict:
        mode = self.mode
        if mode == "earliest":
            with self.options.connect() as conn:
                planned = _flight.lake_split(conn, self.options.table)
            if planned.get("union") and planned.get("snapshot_id") is not None:
                start = _offset({int(b): o for b, o in planned["offsets"].items()})
                return {**start, LAKE_KEY: int(planned["snapshot_id"])}
            return _offset(self._offsets("start"))
        if mode == "latest":
            return _offset(self._offsets("end"))
        if mode == "timestamp":
            stamp = self.options.get("startup.timestamp")
            if stamp is None:
                raise ValueError("startup.mode=timestamp needs option('startup.timestamp', epoch_ms)")
            return _offset(self._offsets("timestamp", timestamp_ms=int(stamp)))
        if mode == "offsets":
            import json
            given = self.options.get("startup.offsets")
            if not given:
                raise ValueError("startup.mode=offsets needs option('startup.offsets', '{\"0\": 0}')")
            starts = self._offsets("start")
            for bucket, offset in json.loads(given).items():
                if int(bucket) not in starts:
                    raise ValueError(f"table {self.options.table} has no bucket {bucket}")
                if int(offset) < starts[int(bucket)]:
                    raise ValueError(f"table {self.options.table} bucket {bucket}: log offset {offset} "
                                     f"has expired; the earliest offset still held is "
                                     f"{starts[int(bucket)]} (use startup.mode=earliest or full)")
                starts[int(bucket)] = int(offset)
            return _offset(starts)
        if mode == "full":
            if not self.primary_key:  # a log table's "snapshot" is its whole log
                return _offset(self._offsets("start"))
            return _offset(self._offsets("end"), snapshot=True)
        raise ValueError(f"unknown startup.mode {mode!r}: earliest, latest, timestamp, offsets or full")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._offsets("end")

    def _planned_lake(self, snapshot_id: int) -> tuple[dict, list[LakeFile]]:
        """The lake part of a stream from ``earliest``: the server's plan of ``snapshot_id`` and its
        data files in path order, with their row counts."""
        with self.options.connect() as conn:
            planned = _flight.lake_split(conn, self.options.table, snapshot_id=snapshot_id)
        files = sorted((f["path"], int(f["rows"])) for f in planned["files"])
        self._lake_files[snapshot_id] = files
        return planned, files

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _buckets(start)
        end = self._available_now if self._available_now is not None else self._offsets("end")
        end = {b: max(o, begin.get(b, 0)) for b, o in end.items()}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            if start.get(LAKE_KEY) is not None:  # still in the lake part: its rows count first
                snapshot_id = int(start[LAKE_KEY])
                files = self._lake_files.get(snapshot_id) or self._planned_lake(snapshot_id)[1]
                at = _lake_at(start)
                stop = lake_advance(files, at, budget)
                if stop is not None:  # the lake part goes on in the next micro-batch
                    return {**_offset(begin), LAKE_KEY: snapshot_id, LAKE_AT_KEY: list(stop)}
                budget = max(0, budget - sum(last - first for _, first, last in lake_ranges(files, at, None)))
            end = allot_rows(begin, end, budget)
        return _offset(end)  # differs from a snapshot (or lake) start even when no bucket moved

    def reportLatestOffset(self) -> dict:
        return _offset(self._offsets("end"))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        snapshot = bool(start.get(SNAPSHOT_KEY))
        begin, stop = _buckets(start), _buckets(end)
        parts = []
        if start.get(LAKE_KEY) is not None:  # a micro-batch of `earliest`'s lake part: lake rows first
            planned, files = self._planned_lake(int(start[LAKE_KEY]))
            io = _flight.lake_io(self.options, planned)
            sizes = dict(files)
            stop_at = _lake_at(end) if end.get(LAKE_KEY) is not None else None
            for path, first, last in lake_ranges(files, _lake_at(start), stop_at):
                whole = first == 0 and last == sizes[path]
                parts.append(InputPartition({"lake": {"files": [path], "io": io, "schema": planned["schema"],
                                                      "rows": None if whole else [first, last]}}))
        for bucket in sorted(stop):
            first = begin.get(bucket, 0)
            if stop[bucket] > first or snapshot:
                parts.append(InputPartition({"bucket": bucket, "start": first, "end": stop[bucket],
                                             "snapshot": snapshot}))
        return parts

    def commit(self, end: dict) -> None:
        pass

    # ---- reading (executors) ------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = partition.value
        columns = self.schema.fieldNames()
        if "lake" in part:
            yield from conform_batches(_lake_changelog(part["lake"], columns), self.schema)
            return
        bucket, first, stop = part["bucket"], part["start"], part["end"]
        with self.options.connect() as conn:
            if part["snapshot"]:
                payload = {"op": "snapshot", "table": self.options.table, "bucket": bucket, "at": first,
                           "columns": columns}
                yield from conform_batches(_flight.read_payload(conn, payload), self.schema)
            if stop > first:
                payload = {"op": "subscribe", "table": self.options.table, "columns": columns,
                           "start": {str(bucket): first}, "until": {str(bucket): stop}}
                yield from conform_batches(_flight.read_payload(conn, payload), self.schema)
