"""Delta join: ``left [LEFT|INNER] JOIN right ON key`` maintained in a flightstore primary-key sink,
with no join state in Spark (FLIP-486's delta join, as Fluss runs it on Flink).

``left`` and ``right`` are primary-key tables; ``right``'s primary key is the join key and both are
bucketed by it (``left``'s primary key starts with it). The sink has ``left``'s primary key and
columns plus ``right``'s non-key columns. One streaming query subscribes to both changelogs; every
micro-batch is shuffled by a hash of the join key into shards (``spark.sql.shuffle.partitions``),
so all changes of a key meet in one task, which folds them to the last change per primary key and
then

* left ``+I``/``+U``: looks up ``right``'s row of the key and upserts the whole wide row (inner
  join: a key without one deletes the sink row); left ``-D``: deletes the sink row;
* right ``+I``/``+U``/``-D``: looks up the ``left`` rows of the key (a prefix lookup) and updates
  their sink rows: left join, a partial update of ``right``'s columns (nulls for ``-D``); inner
  join, the whole wide rows (``-D``: deletes them).

Lookups are batched (one per side per task) and cached (:mod:`.join_cache`: ``--cache-enabled``,
``--left-cache-size``, ``--right-cache-size``, FLIP-486's ``cache-enabled``, ``left.cache-size``
and ``right.cache-size``; on, 10,000 keys per shard each); the changelog keeps the caches exact.

The storage holds the state (both tables); Spark keeps none. Each write is one DoPut with writer id
``dj-<query id>-<batch>-<shard>-<step>`` and sequence 0, so a replayed micro-batch is not applied
twice. Once both streams are drained the sink equals the batch join of the two tables.

``--startup-mode lake`` first joins the two tables' lake snapshots in Spark batch mode and writes
the sink, then streams from exactly the offsets those snapshots recorded (:mod:`.backfill`).

    python -m flightstore_spark.pipelines.delta_join --uri grpc://127.0.0.1:8815 \\
        --left db.orders --right db.customers --key customer_id --sink db.orders_wide \\
        --checkpoint /tmp/dj [--trigger availableNow|<seconds>] [--join-type left|inner] \\
        [--startup-mode earliest|full|latest|lake] [--cache-enabled true|false] \\
        [--left-cache-size 10000] [--right-cache-size 10000]
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore_spark import _flight
from flightstore_spark.pipelines._common import (
    distinct_keys,
    fold_last,
    local_spark,
    match_rows,
    pipeline_parser,
    query_identity,
    with_trigger,
)
from flightstore_spark.pipelines.join_cache import WORKER_CACHES, CacheRegistry, CacheSettings, ShardCaches
from flightstore_spark.pipelines.lookups import lookup_rows

__all__ = ["DeltaJoin", "JOIN_TYPES", "main", "start", "stream_stream_join_state"]

UPSERT_KINDS = pa.array(["+I", "+U", "+A"])
CHANGE_KINDS = pa.array(["+I", "+U", "+A", "-D"])
JOIN_TYPES = ("left", "inner")

# What each task reports to the driver: the shard it applied, the worker that holds its caches.
TASK_RESULT = pa.schema([("shard", pa.int32()), ("worker", pa.string()), ("rows", pa.int64()),
                         ("hits", pa.int64()), ("misses", pa.int64()), ("left_upserts", pa.int64()),
                         ("left_deletes", pa.int64()), ("right_updates", pa.int64()),
                         ("right_deletes", pa.int64())])
TASK_RESULT_DDL = ("shard int, worker string, rows bigint, hits bigint, misses bigint, left_upserts bigint, "
                   "left_deletes bigint, right_updates bigint, right_deletes bigint")


@dataclass
class DeltaJoin:
    """The join's shape and knobs (picklable, shipped to the tasks)."""

    uri: str
    left: str
    right: str
    sink: str
    key: list[str]
    left_key: list[str]
    left_columns: list[str]
    right_columns: list[str]  # right's non-key columns
    join_type: str = "left"
    cache: CacheSettings = field(default_factory=CacheSettings)
    last_batch: list[dict] = field(default_factory=list)  # the driver's view of the last micro-batch

    @classmethod
    def resolve(cls, uri: str, left: str, right: str, sink: str | None, key: Sequence[str], *,
                join_type: str = "left", cache: CacheSettings | None = None) -> DeltaJoin:
        """Check the tables' shapes on the server (``sink`` None: only the two inputs)."""
        if join_type not in JOIN_TYPES:
            raise ValueError(f"unknown join type {join_type!r}: {' or '.join(JOIN_TYPES)}")
        key = list(key)
        with _flight.open_connection(uri) as conn:
            left_info, right_info = _flight.table_info(conn, left), _flight.table_info(conn, right)
            sink_info = _flight.table_info(conn, sink) if sink else None
        if list(right_info.primary_key) != key:
            raise ValueError(f"the join key {key} must be the primary key of {right} "
                             f"({right_info.primary_key})")
        if list(left_info.primary_key[:len(key)]) != key:
            raise ValueError(f"the primary key of {left} ({left_info.primary_key}) must start with the "
                             f"join key {key}")
        right_columns = [c for c in right_info.schema.names if c not in key]
        clash = [c for c in right_columns if c in left_info.schema.names]
        if clash:
            raise ValueError(f"columns {clash} are in both {left} and {right}; rename one side")
        wide = left_info.schema.names + right_columns
        if sink_info is not None and (sorted(sink_info.schema.names) != sorted(wide)
                                      or sink_info.primary_key != left_info.primary_key):
            raise ValueError(f"the sink {sink} needs columns {wide} and primary key {left_info.primary_key}")
        return cls(uri, left, right, sink or "", key, list(left_info.primary_key), list(left_info.schema.names),
                   right_columns, join_type, cache or CacheSettings())

    # ---- one task of one micro-batch ----------------------------------------------------------
    def apply(self, changes: pa.Table, writer_prefix: str, caches: ShardCaches | None = None) -> dict[str, int]:
        """Apply one shard's changes of a micro-batch (``_side`` L/R, in log order per key) to the
        sink; ``caches``: the shard's lookup caches in this worker (None: caching off)."""
        written = {"left_upserts": 0, "left_deletes": 0, "right_updates": 0, "right_deletes": 0}
        side = changes.column("_side")
        left = fold_last(changes.filter(pc.equal(side, "L")), self.left_key)
        right = fold_last(changes.filter(pc.equal(side, "R")), self.key)
        right = right.filter(pc.is_in(right.column("_change_type"), CHANGE_KINDS))
        if caches is not None:  # the changelog first: no lookup below may see an entry it changed
            caches.observe(left, right, self.left_columns, self.key + self.right_columns, UPSERT_KINDS)
        with _flight.open_connection(self.uri) as conn:
            if left.num_rows:
                self._left_changes(conn, left, writer_prefix, caches, written)
            if right.num_rows:
                # Left rows this task just wrote (or deleted) already hold a right row at least as
                # new as this batch's change of their key (the caches saw it first; the table is
                # never behind the stream): the right changes skip them.
                done = left.select(self.left_key) if left.num_rows else None
                self._right_changes(conn, right, writer_prefix, caches, written, done)
        return written

    def _left_changes(self, conn, left: pa.Table, prefix: str, caches: ShardCaches | None,
                      written: dict[str, int]) -> None:
        """Left ``-D``: the sink row goes. Left upserts: the whole wide row, with ``right``'s row
        of the key (inner join: a left row whose key has none leaves the sink)."""
        kinds = left.column("_change_type")
        deletes = left.filter(pc.equal(kinds, "-D")).select(self.left_key)
        upserts = left.filter(pc.is_in(kinds, UPSERT_KINDS)).select(self.left_columns)
        if upserts.num_rows:
            found = self._right_rows(conn, distinct_keys(upserts, self.key), caches)
            at = match_rows(upserts, found, self.key)
            if self.join_type == "inner":
                matched = at.is_valid()
                deletes = pa.concat_tables([deletes, upserts.filter(pc.invert(matched)).select(self.left_key)])
                upserts, at = upserts.filter(matched), at.filter(matched)
            wide = upserts
            for name in self.right_columns:
                wide = wide.append_column(name, found.column(name).take(at))
            if wide.num_rows:
                self._put(conn, "upsert", wide, f"{prefix}-lu")
                written["left_upserts"] = wide.num_rows
        if deletes.num_rows:
            self._put(conn, "delete", deletes, f"{prefix}-ld")
            written["left_deletes"] = deletes.num_rows

    def _right_changes(self, conn, right: pa.Table, prefix: str, caches: ShardCaches | None,
                       written: dict[str, int], done: pa.Table | None) -> None:
        """Right changes reach the sink rows of every left row of their key: left join, a partial
        update of right's columns (nulls for ``-D``); inner join, whole wide rows (``-D``: the
        rows leave the sink)."""
        deleted = pc.equal(right.column("_change_type"), "-D")
        values = right.select(self.key)
        for name in self.right_columns:
            column = right.column(name)
            values = values.append_column(name, pc.if_else(deleted, pa.nulls(len(column), column.type), column))
        rows = self._left_rows(conn, distinct_keys(values, self.key), caches)
        if done is not None and rows.num_rows:
            rows = rows.filter(match_rows(rows.select(self.left_key), done, self.left_key).is_null())
        if rows.num_rows == 0:
            return
        at = match_rows(rows, values, self.key)
        if self.join_type == "left":
            rows = rows.select(self.left_key)
            for name in self.right_columns:
                rows = rows.append_column(name, values.column(name).take(at))
            self._put(conn, "upsert", rows, f"{prefix}-r", columns=self.left_key + self.right_columns)
            written["right_updates"] = rows.num_rows
            return
        gone = deleted.take(at)
        wide = rows.filter(pc.invert(gone)).select(self.left_columns)
        kept = at.filter(pc.invert(gone))
        for name in self.right_columns:
            wide = wide.append_column(name, values.column(name).take(kept))
        if wide.num_rows:
            self._put(conn, "upsert", wide, f"{prefix}-r")
            written["right_updates"] = wide.num_rows
        dropped = rows.filter(gone).select(self.left_key)
        if dropped.num_rows:
            self._put(conn, "delete", dropped, f"{prefix}-rd")
            written["right_deletes"] = dropped.num_rows

    def _right_rows(self, conn, keys: pa.Table, caches: ShardCaches | None) -> pa.Table:
        """``right``'s rows (key + columns) of ``keys``, from the cache where it holds them."""
        columns = self.key + self.right_columns
        if caches is None:
            return lookup_rows(conn, self.right, keys, columns, prefix=False)
        hit, missed = caches.right.split(keys)
        parts = [caches.right.rows_for(hit)] if hit.num_rows else []
        if missed.num_rows:
            fetched = lookup_rows(conn, self.right, missed, columns, prefix=False)
            caches.right.fill(missed, fetched)
            parts.append(fetched)
        return _concat(parts)

    def _left_rows(self, conn, keys: pa.Table, caches: ShardCaches | None) -> pa.Table:
        """``left``'s rows of ``keys`` (left join: the primary key; inner join: every column),
        from the cache where it holds them."""
        columns = self.left_key if self.join_type == "left" else self.left_columns
        if caches is None:
            return lookup_rows(conn, self.left, keys, columns, prefix=True)
        hit, missed = caches.left.split(keys)
        parts = [caches.left.rows_for(hit).select(columns)] if hit.num_rows else []
        if missed.num_rows:
            fetched = lookup_rows(conn, self.left, missed, columns, prefix=True)
            caches.left.fill(missed, fetched)
            parts.append(fetched)
        return _concat(parts)

    def _put(self, conn, op: str, rows: pa.Table, writer_id: str, columns: list[str] | None = None) -> None:
        """One idempotent write to the sink: a replayed micro-batch sends the same writer id and
        sequence 0, which the sink's buckets recognize (the sink is bucketed by the join key)."""
        _flight.put_once(conn, op, self.sink, rows, writer_id=writer_id, sequence=0, columns=columns)

    def apply_task(self, batches: Iterator[pa.RecordBatch], prefix: str, run: str, owners: dict[int, str],
                   worker: CacheRegistry = WORKER_CACHES) -> Iterator[pa.RecordBatch]:
        """One Spark task: its rows by shard (``_shard``), each shard applied with this worker's
        caches of it; yields one row per shard for the driver's owner map."""
        rows = [b for b in batches if b.num_rows]
        if not rows:
            return
        changes = pa.Table.from_batches(rows)
        shards = changes.column("_shard").to_numpy(zero_copy_only=False)
        for shard in np.unique(shards).tolist():
            part = changes.filter(pa.array(shards == shard))
            caches = worker.shard(run, shard, owners.get(shard), self.key, self.left_key, self.cache)
            written = self.apply(part, f"{prefix}-{shard}", caches)
            yield pa.RecordBatch.from_pylist([{
                "shard": shard, "worker": worker.token, "rows": part.num_rows,
                "hits": 0 if caches is None else caches.left.hits + caches.right.hits,
                "misses": 0 if caches is None else caches.left.misses + caches.right.misses,
                **written}], schema=TASK_RESULT)

    # ---- Spark plumbing -----------------------------------------------------------------------
    def changes(self, spark, startup: str | dict[str, dict[int, int]] = "earliest", max_rows: int | None = None):
        """Both changelogs as one stream: ``_side``, the wide columns, ``_change_type``, ``_log_offset``.
        ``startup``: a startup mode for both, or per table (``left``/``right``) the offsets to start at.

        ``-U`` rows are dropped before the shuffle: a task applies only a key's last ``+I``/``+U``/
        ``+A``/``-D`` (the ``+U`` that follows a ``-U`` carries the new row), and an update's ``-U``
        is a third of an updated table's changelog that Spark would otherwise shuffle, sort and
        hand to the tasks for nothing."""
        from pyspark.sql import functions as F

        def side(table: str, which: str, tag: str, columns: list[str]):
            reader = spark.readStream.format("flightstore").option("uri", self.uri).option("table", table)
            if isinstance(startup, dict):
                reader = reader.option("startup.mode", "offsets").option(
                    "startup.offsets", json.dumps({str(b): o for b, o in startup[which].items()}))
            else:
                reader = reader.option("startup.mode", startup)
            if max_rows:
                reader = reader.option("maxRowsPerTrigger", str(max_rows))
            df = reader.load().filter(F.col("_change_type") != "-U")
            return df.select(F.lit(tag).alias("_side"), *columns, "_change_type", "_log_offset")

        left = side(self.left, "left", "L", self.left_columns)
        right = side(self.right, "right", "R", self.key + self.right_columns)
        return left.unionByName(right, allowMissingColumns=True)

    def foreach_batch(self, name: str):
        """The micro-batch function: shuffle by a hash of the join key into shards, apply each
        shard in a task (Arrow batches in, no Spark state), and keep the shards' owners."""
        from pyspark.sql import functions as F

        join, run, owners = self, uuid.uuid4().hex, {}

        def process(df, batch_id: int) -> None:
            session = df.sparkSession
            prefix = f"dj-{query_identity(session, name)}-{batch_id}"
            shards = int(session.conf.get("spark.sql.shuffle.partitions"))
            known = dict(owners)

            def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                yield from join.apply_task(batches, prefix, run, known)

            keyed = df.withColumn("_shard", F.pmod(F.hash(*join.key), F.lit(shards)).cast("int"))
            results = (keyed.repartition(shards, "_shard").sortWithinPartitions("_log_offset")
                       .mapInArrow(task, TASK_RESULT_DDL).collect())
            for row in results:
                owners[row["shard"]] = row["worker"]
            join.last_batch = [row.asDict() for row in results]

        return process


def _concat(parts: list[pa.Table]) -> pa.Table:
    """Cached and fetched rows as one table (``parts``: at least one, as the keys were not none)."""
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables([parts[0]] + [p.select(parts[0].column_names).cast(parts[0].schema) for p in parts[1:]])


def start(spark, uri: str, left: str, right: str, key: Sequence[str], sink: str, checkpoint: str, *,
          trigger: str = "availableNow", startup_mode: str = "earliest", max_rows: int | None = None,
          name: str | None = None, join_type: str = "left", cache: CacheSettings | None = None,
          startup_offsets: dict[str, dict[int, int]] | None = None):
    """Start the delta join; returns the StreamingQuery. ``startup_offsets`` (``left``/``right``:
    per-bucket offsets) overrides ``startup_mode``: the lake backfill continues from there."""
    join = DeltaJoin.resolve(uri, left, right, sink, key, join_type=join_type, cache=cache)
    writer = (join.changes(spark, startup_offsets or startup_mode, max_rows).writeStream
              .foreachBatch(join.foreach_batch(name or f"{left}-{right}-{sink}"))
              .option("checkpointLocation", checkpoint))
    writer = with_trigger(writer, trigger)
    return writer.start()


def stream_stream_join_state(spark, uri: str, left: str, right: str, key: Sequence[str],
                             checkpoint: str) -> dict[str, int]:
    """The same join as a Spark stream-stream join (inner join of the two changelogs' upserts, no
    watermark: Spark must keep both sides); returns its state store size after draining."""
    join = DeltaJoin.resolve(uri, left, right, None, key)
    from pyspark.sql import functions as F

    def side(table: str, columns: list[str], alias: str):
        df = (spark.readStream.format("flightstore").option("uri", uri).option("table", table)
              .option("startup.mode", "earliest").load())
        df = df.filter(F.col("_change_type").isin("+I", "+U", "+A")).select(*columns)
        return df.alias(alias)

    left_df = side(left, join.left_columns, "l")
    right_df = side(right, join.key + join.right_columns, "r")
    joined = left_df.join(right_df, on=list(join.key), how="inner")
    query = (joined.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    progress = query.lastProgress or {}
    operators = progress.get("stateOperators", [])
    return {"memoryUsedBytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
            "numRowsTotal": sum(int(op.get("numRowsTotal", 0)) for op in operators)}


def _flag(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = pipeline_parser("delta_join", __doc__)
    parser.add_argument("--left", required=True, help="primary-key table whose key starts with --key")
    parser.add_argument("--right", required=True, help="primary-key table keyed by --key")
    parser.add_argument("--key", required=True, help="join key column(s), comma separated")
    parser.add_argument("--sink", required=True, help="primary-key table: left's key, left + right columns")
    parser.add_argument("--join-type", default="left", choices=JOIN_TYPES)
    parser.add_argument("--startup-mode", default="earliest", choices=["earliest", "full", "latest", "lake"],
                        help="lake: join the lake snapshots in Spark batch mode first, then stream from "
                             "their offsets")
    parser.add_argument("--max-rows-per-trigger", type=int, default=None)
    parser.add_argument("--cache-enabled", type=_flag, default=True, help="lookup caches (FLIP-486), default true")
    parser.add_argument("--left-cache-size", type=int, default=10_000, help="left lookup cache, keys per shard")
    parser.add_argument("--right-cache-size", type=int, default=10_000, help="right lookup cache, keys per shard")
    args = parser.parse_args(argv)
    try:
        cache = CacheSettings(args.cache_enabled, args.left_cache_size, args.right_cache_size)
    except ValueError as exc:
        parser.error(str(exc))
    spark = local_spark(args.master, "flightstore-delta-join")
    key = args.key.split(",")
    offsets = None
    mode = args.startup_mode
    if mode == "lake":
        from flightstore_spark.pipelines.backfill import backfill
        offsets = backfill(spark, args.uri, args.left, args.right, key, args.sink, args.checkpoint,
                           join_type=args.join_type)
    query = start(spark, args.uri, args.left, args.right, key, args.sink, _stream_checkpoint(args.checkpoint, mode),
                  trigger=args.trigger, startup_mode=mode, max_rows=args.max_rows_per_trigger,
                  join_type=args.join_type, cache=cache, startup_offsets=offsets)
    query.awaitTermination()
    spark.stop()


def _stream_checkpoint(checkpoint: str, mode: str) -> str:
    """The streaming query's checkpoint (beside the backfill's record in lake mode)."""
    return checkpoint.rstrip("/") + "/stream" if mode == "lake" else checkpoint


if __name__ == "__main__":
    main()
