"""A table's read path: point and prefix lookups, scans (pruned by key range and bucket, cut to a
limit), row counts and reads of a bucket as of an offset (KV snapshot image plus changelog).
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype, memory
from flightstore.batches import limited_sources
from flightstore.bucketing import integer_bucket
from flightstore.errors import DataLoss, InvalidInput, SchemaMismatch
from flightstore.expressions import Predicate
from flightstore.kv import ranges
from flightstore.kv.encoding import encode_keys, integer_key, integer_key_layout
from flightstore.kv.ranges import KeyRange
from flightstore.kv.tablet import LOOKUP_CHUNK_KEYS
from flightstore.schema import as_table

__all__ = ["TableReads"]


class TableReads:
    """The reads of :class:`~flightstore.store.Table` (mixed into it: ``self`` is the
    table, with its descriptor, logs, KV tablets, writers and locks)."""

    # ---- reads --------------------------------------------------------------------------------
    def _pk_table(self, keys: Any, columns: Sequence[str]) -> pa.Table:
        table = as_table(keys)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise InvalidInput(f"lookup in {self.path} needs column(s) {missing}")
        arrays, cast = [], False
        for name in columns:
            field = self.schema.field(name)
            column = table.column(name)
            if column.null_count:
                raise InvalidInput(f"lookup key column {name!r} must not be null")
            if column.type == field.type:
                arrays.append(column)
                continue
            try:
                arrays.append(pc.cast(column, field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaMismatch(f"key column {name!r}: cannot convert {column.type} to "
                                     f"{field.type}: {exc}") from None
            cast = True
        if not cast and table.num_columns == len(columns) and table.column_names == list(columns):
            return table  # already the key columns, typed as stored (a planned lookup's keys)
        return pa.Table.from_arrays(arrays, names=list(columns))

    def projection(self, columns: Sequence[str]) -> pa.Schema:
        """The schema of ``columns`` of this table (memoized: lookups ask for the same few)."""
        return self._projections.of(columns)

    def _check_columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return self.schema.names
        known = self._projections.names
        bad = [c for c in columns if c not in known]
        if bad:
            raise InvalidInput(f"table {self.path} has no column(s) {bad}")
        return list(columns)

    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows with the given primary keys (multi-get per bucket), in key order of ``keys``."""
        self._require_pk("lookup")
        columns = self._check_columns(columns)
        out_schema = self._projections.of(columns)
        point = self._point_key(keys)
        if point is not None:  # one key of integers: no key table, bucket array or key encoding
            rows = self.kvs[point[0]].lookup_key(point[1], columns)
            return rows.replace_schema_metadata() if rows.schema.equals(out_schema) else rows.cast(out_schema)
        keys = self._pk_table(keys, self.descriptor.primary_key)
        if keys.num_rows == 0:
            return out_schema.empty_table()
        buckets = self.buckets_of(keys)
        if keys.num_rows == 1 or (buckets == buckets[0]).all():  # one bucket: no reordering
            rows = self.kvs[buckets[0]].lookup(keys, columns)[1]
            return rows.replace_schema_metadata() if rows.schema.equals(out_schema) else rows.cast(out_schema)
        if keys.num_rows <= self._lookup_rows():
            rows = self._lookup_decoded_once(keys, buckets, columns, out_schema)
            if rows is not None:
                return rows
        parts, positions = [], []
        for bucket in np.unique(buckets):
            mask = buckets == bucket
            found, rows = self.kvs[bucket].lookup(keys.filter(pa.array(mask)), columns)
            parts.append(rows)
            positions.append(np.flatnonzero(mask)[found])
        result = pa.concat_tables(parts)
        order = np.argsort(np.concatenate(positions), kind="stable")
        return result.take(pa.array(order)).cast(out_schema)

    def _lookup_rows(self) -> int:
        """Keys a lookup decodes at once (:meth:`_lookup_decoded_once`): a batch of this schema's
        rows within :data:`LOOKUP_CHUNK_KEYS`, worked out once per schema (not per lookup)."""
        memo = self._lookup_rows_memo
        if memo is None or memo[0] is not self.schema:
            memo = self._lookup_rows_memo = (self.schema, memory.batch_rows(self.schema, LOOKUP_CHUNK_KEYS))
        return memo[1]

    def _lookup_decoded_once(self, keys: pa.Table, buckets: np.ndarray, columns: Sequence[str],
                             out_schema: pa.Schema) -> pa.Table | None:
        """:meth:`lookup` of keys in several buckets: one multi-get per bucket
        (:meth:`~flightstore.kv.tablet.KvTablet.stored_values`), the values put back in key order,
        and all of them decoded as one batch (decoding each bucket's few rows apart cost ~0.6 ms
        per bucket of a 128-key lookup, most of the server's work). None when the buckets' codecs
        differ (a bucket mid-way through a schema change): the caller decodes bucket by bucket.

        The keys are sorted by bucket once (one argsort), so each bucket's keys are a slice of
        one list: no mask, index or gather per bucket (a 32-key lookup spans every bucket of a
        small table, and its per-bucket numpy calls cost more than its multi-gets)."""
        n = keys.num_rows
        order = np.argsort(buckets, kind="stable")
        by_bucket = buckets[order]
        starts = [0, *(np.flatnonzero(by_bucket[1:] != by_bucket[:-1]) + 1).tolist()]
        tablets = [self.kvs[bucket] for bucket in by_bucket[starts].tolist()]
        if any(kv.codec.version != tablets[0].codec.version for kv in tablets):
            return None
        encoded = np.empty(n, dtype=object)
        encoded[:] = encode_keys(keys, self.descriptor.primary_key)
        encoded = encoded[order].tolist()
        stored: list = []
        for kv, start, stop in zip(tablets, starts, [*starts[1:], n]):
            stored += kv.stored_values(encoded[start:stop])
        codec = tablets[-1].codec
        values = np.empty(n, dtype=object)  # None: a missing key
        values[order] = stored  # back in key order
        # from a list: pa.array of an object ndarray takes pyarrow's pandas conversion path, ~9x
        # slower (~0.6 ms for a 128-key lookup under load, against ~0.07 ms from the list)
        array = pa.array(values.tolist(), pa.large_binary())
        if array.null_count:
            array = array.drop_null()
        memory.require(int(array.nbytes), f"{self.path}: a lookup of {n} keys")
        rows = codec.decode(array, columns)  # in key order already: no reordering
        return rows.replace_schema_metadata() if rows.schema.equals(out_schema) else rows.cast(out_schema)

    def _point_key(self, keys: Any) -> tuple[int, bytes] | None:
        """(bucket, encoded key) of ``keys`` when it is one row of exactly the primary key columns,
        all integers, as stored (a point lookup's key as the lookup stream and planned lookups
        send it): worked out on Python ints. None otherwise (a null too): the general path
        checks, converts and encodes it."""
        if not isinstance(keys, (pa.Table, pa.RecordBatch)) or keys.num_rows != 1:
            return None
        _, schema, layout, _ = self._point_shape()
        if layout is None:
            return None
        given = keys.schema
        if not given.equals(schema) and (given.names != schema.names or given.types != schema.types):
            return None
        values = [keys.column(i)[0].as_py() for i in range(len(layout))]
        if None in values:
            return None
        return self.point(values)

    def point(self, values: Sequence[int]) -> tuple[int, bytes] | None:
        """(bucket, encoded key) of one primary key given as Python ints in key column order (in
        range of their types, as a key batch of the key schema holds them): what
        :meth:`lookup` reads for that key, without a key table. None when the key columns are
        not all integers (the caller builds a key table and calls :meth:`lookup`)."""
        _, _, layout, bucket_positions = self._point_shape()
        if layout is None or len(values) != len(layout):
            return None
        return (integer_bucket([values[i] for i in bucket_positions], self.num_buckets),
                integer_key(values, layout))

    def _point_shape(self) -> tuple:
        """:func:`_point_plan` of the table's current descriptor, made on first use and again when
        the table changed shape."""
        plan = self._point_plan
        if plan is None or plan[0] is not self.descriptor:
            plan = self._point_plan = _point_plan(self.descriptor)
        return plan

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose leading primary-key columns (at least the bucket key) equal ``prefix`` rows."""
        self._require_pk("prefix lookup")
        columns = self._check_columns(columns)
        table = as_table(prefix)
        key = self.descriptor.primary_key
        width = len(table.column_names)
        if tuple(table.column_names) != key[:width] or width < len(self.descriptor.bucket_key):
            raise InvalidInput(f"a prefix lookup on {self.path} needs the leading primary key columns "
                               f"{list(key[:max(width, len(self.descriptor.bucket_key))])} (bucket key "
                               f"{list(self.descriptor.bucket_key)}), got {table.column_names}")
        table = self._pk_table(table, key[:width])
        out_schema = self._projections.of(columns)
        buckets = self.buckets_of(table)
        prefixes = encode_keys(table, key[:width])
        if limit is None:
            return self._prefix_rows(np.asarray(buckets), prefixes, columns, out_schema)
        parts, remaining = [], limit  # with a limit: prefix by prefix, until it is reached
        for bucket, prefix_key in zip(buckets, prefixes):
            if remaining <= 0:
                break
            parts.append(self.kvs[bucket].prefix_lookup([prefix_key], columns, remaining))
            remaining -= parts[-1].num_rows
        return pa.concat_tables(parts).cast(out_schema) if parts else out_schema.empty_table()

    def _prefix_rows(self, buckets: np.ndarray, prefixes: Sequence[bytes], columns: Sequence[str],
                     out_schema: pa.Schema) -> pa.Table:
        """The rows of every prefix in prefix order: one read per bucket of all its prefixes
        (:meth:`~flightstore.kv.tablet.KvTablet.prefix_rows`), put back in the prefixes' order."""
        parts, positions = [], []
        for bucket in np.unique(buckets).tolist():
            mine = np.flatnonzero(buckets == bucket)
            rows, counts = self.kvs[bucket].prefix_rows([prefixes[i] for i in mine], columns)
            parts.append(rows)
            positions.append(np.repeat(mine, counts))  # the prefix each row answers
        if not parts:
            return out_schema.empty_table()
        result = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        order = np.argsort(np.concatenate(positions), kind="stable")
        return result.take(pa.array(order)).cast(out_schema)

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None,
             key_range: KeyRange | None = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Current rows, only ``columns``, filtered exactly (batches skipped by statistics).

        On a primary-key table the filter's primary-key range (``key_range``, derived from the
        filter when not given; :mod:`flightstore.kv.ranges`) is one RocksDB seek range per bucket,
        and equalities on the whole bucket key read only their bucket. Without a range a bucket is
        read from its newest KV snapshot image plus the changelog after it, consistent at the log
        end offset when the bucket is reached (RocksDB without an image).

        ``exact=False`` lets rows through unfiltered in batches the statistics could not rule out,
        in no particular order: for callers that apply ``filter`` again themselves (residual SQL).
        A primary-key bucket without a usable image is then read from its changelog when the log
        still holds it from offset 0 (see :meth:`KvTablet.full_scan`)."""
        columns = self._check_columns(columns)
        if filter is not None:
            filter = filter.bind(self.schema)
        if self.has_primary_key and filter is not None:
            if key_range is None:
                key_range = ranges.key_range(filter, self.descriptor)
            pinned = ranges.pinned_bucket(filter, self.descriptor)
            if pinned is not None:
                buckets = [b for b in (range(self.num_buckets) if buckets is None else buckets)
                           if b == pinned]

        def open_bucket(bucket: int, remaining: int | None) -> Iterator[pa.RecordBatch]:
            if self.has_primary_key:
                kv = self.kvs[bucket]
                return kv.full_scan(columns, filter, remaining, exact=exact) if key_range is None else \
                    kv.scan(columns, filter, remaining, key_range)
            return (lb.batch for lb in self.logs[bucket].read(0, columns=columns, filter=filter, exact=exact))

        yield from limited_sources((functools.partial(open_bucket, bucket)
                                    for bucket in (range(self.num_buckets) if buckets is None else buckets)), limit)

    def scan_table(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                   limit: int | None = None, *, exact: bool = True) -> pa.Table:
        columns = self._check_columns(columns)
        schema = pa.schema([self.schema.field(c) for c in columns])
        return pa.Table.from_batches(list(self.scan(columns, filter, limit, exact=exact)), schema=schema)

    def row_count(self, partitions: Sequence[str] | None = None) -> int:
        """Rows in the table without a scan: maintained KV counts, or log offsets."""
        if self.has_primary_key:
            return sum(kv.row_count for kv in self.kvs)
        for log in self.logs:
            lost = log.damage()
            if lost:
                raise DataLoss(f"{log.label}: log offsets {lost[0][0]}..{lost[0][1] - 1} are lost; "
                               "the count would be wrong. Run `flightstore repair` to declare it")
        return sum(log.high_watermark - log.start_offset - log.lost_rows for log in self.logs)

    def row_count_of(self, numbers: Sequence[int], partitions: Sequence[str] | None = None) -> int:
        """Rows in the buckets numbered ``numbers`` (within a partition; a cluster server counts
        the buckets it leads)."""
        wanted = {int(n) for n in numbers}
        if self.has_primary_key:
            return sum(kv.committed_row_count() for b, kv in enumerate(self.kvs) if b in wanted)
        return sum(log.high_watermark - log.start_offset - log.lost_rows
                   for b, log in enumerate(self.logs) if b in wanted)

    def rows_at(self, bucket: int, at: int, columns: Sequence[str] | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """The rows of ``bucket`` exactly at log offset ``at`` (a KV snapshot image plus the
        changelog up to ``at``): what a reader that then follows the changelog from ``at`` needs.
        Raises OffsetOutOfRange when ``at`` is outside the held log."""
        self._require_pk("a snapshot read")
        self._check_bucket(bucket)
        return self.kvs[bucket].rows_at(int(at), self._check_columns(columns), None, limit)

    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None
                      ) -> Iterator[pa.RecordBatch]:
        """:meth:`rows_at` as changelog rows (``columns`` of :func:`changetype.snapshot_schema`):
        ``_change_type`` is ``+I``, ``_log_offset`` and ``_commit_timestamp`` are null. A reader
        that then follows the changelog from ``at`` sees every change once."""
        out_schema = changetype.snapshot_schema(self.schema)
        wanted = list(columns) if columns is not None else out_schema.names
        schema = pa.schema([out_schema.field(c) for c in wanted])
        stored = [c for c in wanted if c not in changetype.META_COLUMNS]
        for batch in self.rows_at(bucket, at, stored):
            n = batch.num_rows
            meta = {changetype.CHANGE_TYPE_COLUMN: pa.repeat(pa.scalar("+I", pa.string()), n),
                    changetype.LOG_OFFSET_COLUMN: pa.nulls(n, pa.int64()),
                    changetype.COMMIT_TIMESTAMP_COLUMN: pa.nulls(n, out_schema.field(
                        changetype.COMMIT_TIMESTAMP_COLUMN).type)}
            yield pa.RecordBatch.from_arrays([meta[c] if c in meta else batch.column(c) for c in wanted],
                                             schema=schema)

    def _check_bucket(self, bucket: int) -> None:
        if not 0 <= int(bucket) < self.num_buckets:
            raise InvalidInput(f"table {self.path} has no bucket {bucket}")


def _point_plan(descriptor: Any) -> tuple:
    """What :meth:`TableReads._point_key` needs of a table's shape: ``(descriptor, key schema,
    integer key layout or None, positions of the bucket key columns in the primary key)``; the
    layout is None unless every primary-key column is an integer and the bucket key is among them."""
    key = tuple(descriptor.primary_key)
    fields = [descriptor.schema.field(name) for name in key]
    schema = pa.schema(fields)
    bucket_key = tuple(descriptor.bucket_key)
    if not key or not bucket_key or not set(bucket_key) <= set(key) or \
            not all(pa.types.is_integer(f.type) for f in fields):
        return descriptor, schema, None, ()
    return (descriptor, schema, integer_key_layout([f.type for f in fields]),
            tuple(key.index(name) for name in bucket_key))
