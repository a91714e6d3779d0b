"""``spark.read.format("flightstore")``: schema from the server, one Spark partition per bucket
(of a partitioned table: per partition and bucket, partitions pruned by the pushed filters), Arrow
record batches straight from DoGet, filters and columns pushed to the server.

A datalake-enabled log table is read as its union (as SQL reads it): the server plans the split
(one lake snapshot, the data files left after partition and statistics pruning by the pushed
filters, each bucket's tiered offset), then executors read one lake split per data file straight
from the warehouse (Arrow's Parquet reader; the lake's credentials come from ``lake.<pyiceberg
property>`` options, e.g. ``lake.s3.access-key-id``) plus one log-tail split per bucket from the
server, from that bucket's tiered offset.

Column pruning: PySpark 4.3 gives a Python data source no pruning hook, so ``df.select("a", "b")``
still reads every column from the server; ``option("columns", "a,b")`` is the way to read fewer
(pruned on the server, only those columns leave it). A PySpark that offers
``DataSourceReader.pruneColumns`` (SPARK-51713) is detected (:func:`prunes_columns`) and its
required columns are then read without the option.

``snapshot.id`` reads one lake snapshot of a datalake-enabled table alone (primary-key tables too:
their position deletes are applied by the executors), one partition per data file straight from
the warehouse: the delta join's backfill reads the two tables' snapshots this way.

A partition's batches reach Spark concatenated into batches of up to 64k rows / 32 MB
(:func:`coalesce_batches`): Spark pays per batch, and the server's messages of wide rows stop at
2 MB, far below 64k rows.

Partitions are sized to the cores and the data: a batch read of a table plans at most ``partitions``
input partitions (default: the Spark default parallelism :func:`flightstore_spark.register` found,
else one per bucket), each reading a group of buckets in one DoGet (in a cluster, buckets of one
leader), the groups near-equal in rows (:func:`group_buckets`); under the cores' default no more
than one per 4 MB of estimated data (:func:`sized_partitions`: a small table is one task). Each
Spark task has a fixed cost (the JVM's task, a Python worker round trip, Spark's ``gc.collect()``
in the worker after it, cheap once the worker's imports are frozen: :mod:`flightstore_spark.workers`),
which more tasks than cores, or than the data needs, only repeat. The plan (buckets and their rows) is one round
trip to the server, and every planner and worker process keeps one connection per server across
partitions and queries (:func:`flightstore_spark._flight.shared_connection`).

Options: ``uri`` (grpc://host:port, grpc+tls://host:port), ``table`` (``db.t``) or ``query`` (a whole
SELECT pushed to the server; its Flight endpoints become the partitions), ``columns`` (``a,b``:
pruned on the server), ``partitions`` (most input partitions of a batch table read), ``snapshot.id``,
``username``/``password``, ``tls.root.certs`` (PEM file of the CA that signed
the server's certificate) and, for mutual TLS, ``tls.cert.chain``/``tls.private.key``; streaming options are in
:mod:`flightstore_spark.stream`, write options
in :mod:`flightstore_spark.writer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType

from flightstore import expressions as ex
from flightstore_spark import _flight
from flightstore_spark.filters import to_predicate
from flightstore_spark.workers import freeze_imports

__all__ = ["FlightstoreDataSource", "coalesce_batches", "conform_batches", "group_buckets", "group_files",
           "lake_snapshot_splits", "most_partitions", "prunes_columns", "read_lake_split", "row_bytes",
           "sized_partitions", "spark_schema"]


def spark_schema(schema: pa.Schema, keep_not_null: bool = False) -> StructType:
    """The Spark schema of an Arrow schema (tz-naive timestamps -> NTZ). Every field is nullable,
    unless ``keep_not_null``: then a field the server declares NOT NULL stays non-nullable.

    A table scan keeps NOT NULL (primary-key, partition and NOT NULL columns: the server refuses
    a null there, and ALTER TABLE may only add nullable columns): Spark converts every value of a
    Python data source's Arrow batches to a row in the JVM, twice (Spark's own projections), and a
    non-nullable column skips the null test and null bookkeeping of each value there. Other
    reads (changelog meta columns, pushed queries) keep every field nullable."""
    struct = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    return StructType([StructField(f.name, f.dataType, not keep_not_null or field.nullable, f.metadata)
                       for f, field in zip(struct.fields, schema)])


def conform_batches(batches: Iterator[pa.RecordBatch], schema: StructType) -> Iterator[pa.RecordBatch]:
    """Cast server batches to the exact Arrow layout Spark expects for ``schema`` (no row loops).
    A null in a non-nullable column fails the read (ValueError naming the column) rather than
    reaching Spark, which would read it as a value."""
    target = to_arrow_schema(schema, timezone="UTC")
    required = [i for i, field in enumerate(target) if not field.nullable]
    for batch in batches:
        if not batch.schema.equals(target):
            if batch.schema.names != target.names:
                batch = batch.select(target.names)
            batch = batch.cast(target)  # ValueError on a null cast to a non-nullable field
        for i in required:
            if batch.column(i).null_count:
                raise ValueError(f"column {target.names[i]!r} is NOT NULL but the read returned a null")
        yield batch


# What one Arrow batch handed to Spark may hold (whichever limit comes first). The JVM pays a
# fixed cost per batch a Python data source yields (an Arrow message through the worker's socket,
# a hand-off between the Python worker and the task thread, new column vectors), and the server
# cuts its messages at 2 MB, so a 100-column read arrived in ~2,600-row batches: 300k rows of 100
# columns read in 7.1 s as the server's messages, 4.8 s concatenated up to 32 MB (best of 3
# interleaved, loaded machine). Larger batches than the server's 64k rows bought nothing: a task
# then waits longer before Spark converts its first row (5M narrow rows: 2.5 s as sent, 4.1 s in
# 32 MB batches), so the row limit stays the server's and only narrow messages are joined.
READ_BATCH_BYTES = 32 * 1024 * 1024
READ_BATCH_ROWS = 65_536


def coalesce_batches(batches: Iterator[pa.RecordBatch], max_bytes: int = READ_BATCH_BYTES,
                     max_rows: int = READ_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Consecutive ``batches`` concatenated (one copy, no row loop) into batches of at most
    ``max_bytes`` and ``max_rows`` (a larger batch passes through alone), order kept: fewer,
    larger batches for Spark, which pays per batch."""
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if pending and (rows + batch.num_rows > max_rows or size + batch.nbytes > max_bytes):
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, rows, size = [], 0, 0
        pending.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


STREAMING_OPTIONS = ("startup.mode", "startup.timestamp", "startup.offsets", "maxRowsPerTrigger")


def wants_changelog(options: Any) -> bool:
    if str(options.get("changelog", "")).lower() in ("true", "1", "yes"):
        return True
    return any(options.get(name) is not None for name in STREAMING_OPTIONS)


def read_lake_split(split: dict, schema: StructType) -> Iterator[pa.RecordBatch]:
    """One lake split on an executor: its data file's ``columns``, cast to ``schema`` and filtered
    by the pushed filter exactly (Spark does not filter pushed predicates again)."""
    batches = conform_batches(_flight.read_lake_files(split["files"], split["io"], split["schema"],
                                                      split["columns"]), schema)
    if split.get("filter") is None:
        yield from batches
        return
    target = to_arrow_schema(schema, timezone="UTC")
    condition = ex.from_json(split["filter"]).bind(target).to_arrow()
    for batch in batches:
        kept = pa.Table.from_batches([batch]).filter(condition)
        if kept.num_rows:
            yield from kept.combine_chunks().to_batches()


class FlightstoreDataSource(DataSource):
    """The ``flightstore`` format (batch and streaming, read and write).

    ``default_partitions``: the most input partitions of a batch read when the ``partitions`` option
    is not given (None: one per bucket); :func:`flightstore_spark.register` registers a subclass
    carrying the session's default parallelism (Spark gives a Python planner no other way to learn it).
    """

    default_partitions: int | None = None

    @classmethod
    def name(cls) -> str:
        return "flightstore"

    def schema(self) -> StructType:
        schema = self._schema()
        freeze_imports()  # in the schema planner: what this call imported (flightstore_spark.workers)
        return schema

    def _schema(self) -> StructType:
        options = _flight.Options(self.options)
        conn = options.shared()
        if options.query:
            arrow = _flight.query_endpoints(conn, options.query).schema
        elif self._streaming_schema_wanted():
            arrow = _flight.custom_schema(conn, {"op": "subscribe", "table": options.table,
                                                 "columns": self._stream_columns(conn, options)})
        else:
            arrow = _flight.custom_schema(conn, {"op": "scan", "table": options.table,
                                                 "columns": options.columns})
            return spark_schema(arrow, keep_not_null=True)
        return spark_schema(arrow)

    # Spark asks for the schema before it says whether the read is batch or streaming, so the
    # changelog columns (_change_type, _log_offset, _commit_timestamp) come with ``changelog=true`` or
    # any streaming option; a batch read with them reads the changelog up to the current end offsets.
    def _streaming_schema_wanted(self) -> bool:
        return wants_changelog(self.options)

    def _stream_columns(self, conn: Any, options: _flight.Options) -> list[str] | None:
        from flightstore_spark.stream import stream_columns
        return stream_columns(conn, options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FlightstoreReader(self.options, schema, self.default_partitions)

    def streamReader(self, schema: StructType):
        from flightstore_spark.stream import FlightstoreStreamReader
        return FlightstoreStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool):
        from flightstore_spark.writer import FlightstoreWriter
        return FlightstoreWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from flightstore_spark.writer import FlightstoreStreamWriter
        return FlightstoreStreamWriter(self.options, schema, overwrite)


def most_partitions(option: Any, default: int | None) -> int | None:
    """The ``partitions`` option (a positive integer), else ``default``; None: one per bucket."""
    if option is None or str(option).strip() == "":
        return default
    try:
        value = int(str(option).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"option('partitions') must be a positive integer (most input partitions of a "
                         f"batch read), not {option!r}")
    return value


# The fewest bytes worth a partition of their own (estimated from rows and column widths): Spark's
# own file sources plan a split per ``spark.sql.files.openCostInBytes`` (4 MB) at least. Each Spark
# task costs the JVM and a Python worker a fixed ~50-90 ms of CPU (py-spy and /proc on a tiny read:
# 0.43 CPU-s in two tasks, 0.35 in one), which a small table's second task only repeats.
PARTITION_BYTES = 4 * 1024 * 1024
VARIABLE_WIDTH_BYTES = 32  # the estimate of a string, binary or nested value


def row_bytes(schema: pa.Schema) -> int:
    """An estimate of one row's bytes in Arrow: fixed widths as they are, others
    :data:`VARIABLE_WIDTH_BYTES` (at least 1 byte)."""
    total = 0
    for field in schema:
        try:
            total += max(1, field.type.bit_width // 8)
        except ValueError:  # variable width or nested
            total += VARIABLE_WIDTH_BYTES
    return max(1, total)


def sized_partitions(most: int | None, sized: bool, rows: dict[int, int], schema: pa.Schema) -> int | None:
    """The most input partitions of a read of ``rows`` (per bucket) of ``schema``'s columns:
    ``most``, and when it is the cores' default (``sized``: not the ``partitions`` option, and not
    None, one per bucket, as without :func:`flightstore_spark.register`) no more than one per
    :data:`PARTITION_BYTES` of estimated data, at least one."""
    if not sized or most is None:
        return most
    return min(most, max(1, -(-sum(rows.values()) * row_bytes(schema) // PARTITION_BYTES)))


def group_buckets(buckets: Sequence[int], most: int | None, leader: Callable[[int], str | None],
                  rows: Mapping[int, int] | None = None) -> list[tuple[str | None, list[int]]]:
    """``buckets`` in at most ``most`` groups (None: one group per bucket), never mixing two
    leaders (a leader's buckets are read at it): ``[(uri, buckets)]``. A cluster with more leaders
    than ``most`` gets one group per leader.

    With each bucket's ``rows`` known, a leader's buckets are shared out by rows (the largest
    bucket to the lightest group): a log table's buckets fill round-robin per written message, so
    a table written in few messages (10 appends of 20k rows to 4 buckets: 3, 3, 2 and 2 of them)
    gave one of two tasks 60% of the rows in contiguous halves while the other core idled at the
    end. Without ``rows``: contiguous groups of near-equal bucket counts."""
    by_leader: dict[str | None, list[int]] = {}
    for bucket in buckets:
        by_leader.setdefault(leader(bucket), []).append(bucket)
    total = len(buckets)
    groups: list[tuple[str | None, list[int]]] = []
    for uri, own in by_leader.items():
        count = len(own) if most is None else min(len(own), max(1, round(most * len(own) / total)))
        if rows is not None:
            shares: list[list[int]] = [[] for _ in range(count)]
            loads = [0] * count
            for bucket in sorted(own, key=lambda b: (-int(rows.get(b, 0)), b)):
                lightest = min(range(count), key=lambda i: (loads[i], len(shares[i])))  # none left empty
                shares[lightest].append(bucket)
                loads[lightest] += int(rows.get(bucket, 0))
            groups.extend((uri, sorted(share)) for share in sorted(shares))
            continue
        size, extra = divmod(len(own), count)
        start = 0
        for i in range(count):
            stop = start + size + (1 if i < extra else 0)
            groups.append((uri, own[start:stop]))
            start = stop
    return groups


def group_files(files: Sequence[dict], most: int | None) -> list[list[dict]]:
    """Planned lake files in at most ``most`` groups of near-equal rows (None: one group per
    file): the largest file goes to the lightest group, so one task does not read most rows."""
    count = len(files) if most is None else min(len(files), most)
    groups: list[list[dict]] = [[] for _ in range(count)]
    rows = [0] * count
    for planned in sorted(files, key=lambda f: -int(f.get("rows") or 0)):
        lightest = rows.index(min(rows))
        groups[lightest].append(planned)
        rows[lightest] += int(planned.get("rows") or 0)
    return groups


def lake_snapshot_splits(planned: dict, io: dict[str, str], columns: Sequence[str], filter_json: dict | None,
                         most: int | None) -> list[dict]:
    """The lake splits of a planned lake snapshot (``lake_split(..., lake_only=True)``): its data
    files, each with its position delete files, in at most ``most`` splits (None: one per file)."""
    return [{"files": group, "io": io, "schema": planned["schema"], "columns": list(columns),
             "filter": filter_json} for group in group_files(planned["files"], most)]


def prunes_columns(reader_class: type = DataSourceReader) -> bool:
    """Whether the installed PySpark hands a Python data source the columns a query needs
    (``DataSourceReader.pruneColumns``, proposed by SPARK-51713; PySpark 4.3 has no such hook, so a
    ``.select(...)`` does not reach the server there: use ``option("columns", "a,b")``)."""
    return callable(getattr(reader_class, "pruneColumns", None))


class FlightstoreReader(DataSourceReader):
    """Batch reads: the custom ``scan`` command per bucket, or the endpoints of a pushed query.

    Caveat (Spark 4.3): Spark caches the planned read of a DataFrame after a filter pushdown and
    reuses it for a later action on the same DataFrame that has no pushable filter, so that action
    still sees the earlier filter. Load a fresh DataFrame per differently filtered query, or set
    ``option("pushFilters", "false")``.
    """

    def __init__(self, options: dict, schema: StructType, default_partitions: int | None = None) -> None:
        self.options = _flight.Options(options)
        self.schema = schema
        self.pushed: ex.Predicate | None = None
        self.most_partitions = most_partitions(self.options.get("partitions"), default_partitions)
        self.sized = self.options.get("partitions") is None  # the option is the user's word: kept as given

    def pushFilters(self, filters: list) -> Iterator:
        if self.options.query or str(self.options.get("pushFilters", "true")).lower() == "false":
            yield from filters
            return
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        pushed = []
        for spark_filter in filters:
            predicate = to_predicate(spark_filter, arrow)
            if predicate is None:
                yield spark_filter
            else:
                pushed.append(predicate)
        self.pushed = ex.and_all(pushed)

    def pruneColumns(self, requiredSchema: StructType) -> StructType:  # noqa: N802, N803 - Spark's names
        """Read only the columns the query needs (called by a PySpark that has the hook, see
        :func:`prunes_columns`; never by 4.3). The ``columns`` option, if set, already narrowed
        the schema; a changelog read keeps its changelog columns."""
        if self.options.query or wants_changelog(self.options):
            return self.schema
        wanted = set(requiredSchema.fieldNames())
        kept = [f for f in self.schema.fields if f.name in wanted] or self.schema.fields[:1]  # COUNT(*): one
        self.schema = StructType(kept)
        return self.schema

    def partitions(self) -> Sequence[InputPartition]:
        planned = self._partitions()
        freeze_imports()  # in the partition planner: what planning imported (flightstore_spark.workers)
        return planned

    def _partitions(self) -> list[InputPartition]:
        options = self.options
        conn = options.shared()
        if options.query:
            info = _flight.query_endpoints(conn, options.query)
            return [InputPartition({"ticket": e.ticket.ticket, "uri": _flight.endpoint_uri(e)})
                    for e in info.endpoints]
        if options.get("snapshot.id") is not None:
            return self._lake_snapshot(conn, int(options.get("snapshot.id")))
        client = conn.table(options.table)
        leaders = _flight.leaders(conn, options.table)  # in a cluster: read each bucket at its leader
        if wants_changelog(options):
            starts, ends = client.offsets("start"), client.offsets("end")
            columns = self.schema.fieldNames()
            return [InputPartition({"payload": {
                "op": "subscribe", "table": options.table, "columns": columns,
                "start": {str(b): starts[b]}, "until": {str(b): ends[b]}},
                "uri": leaders[b % len(leaders)] if leaders else None})
                for b in sorted(ends) if ends[b] > starts[b]]
        # The read's plan in one round trip: of a union read its lake split, else the buckets the
        # pushed filters leave (of a partitioned table, per partition) and their rows.
        planned = _flight.lake_split(conn, options.table, self.pushed)
        columns = self.schema.fieldNames()  # the `columns` option's, or what pruneColumns left
        filter_json = self.pushed.to_dict() if self.pushed is not None else None
        if planned.get("union"):
            io = _flight.lake_io(options, planned)
            # each file with its size and CRC-32: the executor checks it before decoding it
            lake = [InputPartition({"lake": {"files": [f], "io": io, "schema": planned["schema"],
                                             "columns": columns, "filter": filter_json}})
                    for f in planned["files"]]
            return lake + [InputPartition({"payload": {
                "op": "scan", "table": options.table, "columns": columns, "filter": filter_json,
                "buckets": [int(b)], "log_from": {b: offset}}})
                for b, offset in sorted(planned["offsets"].items(), key=lambda item: int(item[0]))]
        rows = None
        if "buckets" in planned:
            buckets = [int(b) for b in planned["buckets"]]
            rows = {int(b): int(n) for b, n in planned["rows"].items()}
            most = sized_partitions(self.most_partitions, self.sized, rows,
                                    to_arrow_schema(self.schema, timezone="UTC"))
        else:  # a server that answers the lake split alone
            buckets, most = client.buckets(self.pushed), self.most_partitions
        groups = group_buckets(buckets, most, lambda b: leaders[b % len(leaders)] if leaders else None, rows)
        return [InputPartition({"payload": {"op": "scan", "table": options.table, "columns": columns,
                                            "filter": filter_json, "buckets": group}, "uri": uri})
                for uri, group in groups] or [InputPartition({"empty": True})]  # every partition pruned

    def _lake_snapshot(self, conn: Any, snapshot_id: int) -> list[InputPartition]:
        """``snapshot.id``: that lake snapshot alone, its data files read straight from the
        warehouse (a primary-key table's position deletes applied by the reader), in at most
        ``partitions`` input partitions."""
        planned = _flight.lake_split(conn, self.options.table, self.pushed, snapshot_id, lake_only=True)
        if "files" not in planned:
            raise ValueError(f"table {self.options.table} has no lake: option('snapshot.id') reads a "
                             "datalake-enabled table's lake snapshot")
        filter_json = self.pushed.to_dict() if self.pushed is not None else None
        splits = lake_snapshot_splits(planned, _flight.lake_io(self.options, planned), self.schema.fieldNames(),
                                      filter_json, self.most_partitions)
        return [InputPartition({"lake": split}) for split in splits] or [InputPartition({"empty": True})]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value = partition.value
        if "empty" in value:  # a lake snapshot with no data file
            return
        if "lake" in value:  # straight from the warehouse: no server in the path
            yield from coalesce_batches(read_lake_split(value["lake"], self.schema))
        else:
            conn = self.options.shared(value.get("uri"))  # kept for the worker's next partitions
            if "ticket" in value:
                batches = _flight.read_ticket(conn, value["ticket"])
            else:
                batches = _flight.read_payload(conn, value["payload"])
            yield from coalesce_batches(conform_batches(batches, self.schema))
        freeze_imports()  # in the task's worker: what the read imported (flightstore_spark.workers)
