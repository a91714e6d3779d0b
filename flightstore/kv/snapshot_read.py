"""A bucket's rows exactly at one log offset: a snapshot image merged with the changelog after it.

``rows(at) = image(S) - {keys changed in [S, at)} + {their last change in [S, at), if not a delete}``

The image (:mod:`flightstore.kv.image`) holds the rows at offset ``S``; the changelog records
``[S, at)`` carry full after-images, so the last change of a key in that range *is* its row at
``at`` (``+I``/``+U``) or says it is gone (``-D``; a ``-U`` is always followed by its ``+U``). No
RocksDB read and no lock is involved: the image is immutable and the log below ``at`` never changes,
so the result is the KV exactly at ``at`` whatever writes run meanwhile.

Everything is vectorized: the changelog tail's keys and change types are read column-pruned; its
inserted rows no update or delete touched since are taken as they are, the other keys are
deduplicated with one dictionary encoding of the encoded keys, and the rows left are streamed by a
second column-pruned read of the tail, one log record at a time (memory holds keys, not rows);
each image batch drops the changed keys and applies the filter with one Arrow expression. For a
single integer or temporal key column (the image is sorted by it) the changed keys are found by
binary search (``np.searchsorted``) in the batch's key column, else by one ``is_in`` over the
encoded keys. Image batches come in key order, then the changed rows (in log order).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype, memory
from flightstore.expressions import Predicate
from flightstore.kv.encoding import encode_key_array
from flightstore.kv.image import Image
from flightstore.log.held import read_held
from flightstore.log.tablet import LogTablet

__all__ = ["ChangedRows", "TailTooLong", "changed_rows", "read_at"]


class ChangedRows:
    """The net effect of a changelog range: every key it touched and the rows the range leaves
    (the last change of each key when it is an insert or an update), streamed from the log in log
    order by :meth:`batches` (a second, column-pruned read: the fold holds only keys and
    positions, never the rows)."""

    def __init__(self, keys: pa.Array, source: Callable[[], Iterator[pa.RecordBatch]],
                 sorted_values: np.ndarray | None = None) -> None:
        self.keys = keys  # encoded keys of every touched key (large_binary, distinct)
        self._source = source
        # With a single integer-like key column: its touched values, sorted (else None).
        self.sorted_values = sorted_values

    @property
    def empty(self) -> bool:
        return len(self.keys) == 0

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows the range leaves, batch by batch (one log record at a time)."""
        return self._source()

    @property
    def rows(self) -> pa.Table:
        """:meth:`batches` as one table (tests)."""
        return pa.Table.from_batches(list(self.batches()))


def _ordered_values(array: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """The values of a (null-free) key column as integers whose order is the key order
    (integers, dates, times, timestamps, durations), else None."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_integer(t):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_temporal(t) and not pa.types.is_interval(t) and t.bit_width in (32, 64):
        return array.view(pa.int32() if t.bit_width == 32 else pa.int64()).to_numpy(zero_copy_only=False)
    return None


class TailTooLong(Exception):
    """The changelog tail holds more updates and deletes than a read may fold in memory."""


# Bytes a fold holds per update or delete besides the key columns it read: its encoded key, the
# key's dictionary entry and index, its position.
_FOLD_OVERHEAD = 48


def changed_rows(log: LogTablet, start: int, at: int, primary_key: Sequence[str],
                 columns: Sequence[str], where: str, max_bytes: int | None = None) -> ChangedRows:
    """The net changes of ``[start, at)`` in ``log``, with the table ``columns`` given (the primary
    key columns are read as well). Raises OffsetOutOfRange if the log no longer holds ``start``,
    :class:`TailTooLong` when the fold would hold more than ``max_bytes``: it reads the key columns
    and change types of the range (column-pruned) and holds them, with an encoded key and a
    position per update or delete; the rows themselves are streamed by
    :meth:`ChangedRows.batches`, a second read of the range (its log never changes below ``at``).

    A ``+I`` says its key held no row just before it, so a key whose only record in the range is
    a ``+I`` was absent at ``start`` and holds that record's row at ``at``: such rows are taken as
    they are and their keys are left out of :attr:`ChangedRows.keys` (no image row has them). Only
    the keys some ``-U``/``+U``/``-D`` touched are encoded and deduplicated; a range of inserts
    alone (a bulk load) costs no key encoding at all, and its records stream as they are."""
    wanted = list(dict.fromkeys(list(columns) + list(primary_key)))
    keyed = list(dict.fromkeys([*primary_key, changetype.CHANGE_TYPE_COLUMN]))
    records = list(read_held(log, start, where, columns=keyed, to_offset=at)) if at > start else []

    def stream(keep: np.ndarray | None) -> Callable[[], Iterator[pa.RecordBatch]]:
        def source() -> Iterator[pa.RecordBatch]:
            if not records:
                return
            position = 0
            for record in read_held(log, start, where, columns=wanted, to_offset=at):
                batch = record.batch.select(wanted)
                if keep is None:
                    yield batch
                    continue
                mask = keep[position:position + batch.num_rows]
                position += batch.num_rows
                if mask.all():
                    yield batch
                elif mask.any():
                    yield batch.filter(pa.array(mask))
        return source

    if not records:
        return ChangedRows(pa.array([], pa.large_binary()), stream(None))
    tail = pa.Table.from_batches([r.batch for r in records])
    kinds = tail.column(changetype.CHANGE_TYPE_COLUMN).to_numpy()
    inserts = kinds == changetype.INSERT
    if inserts.all():
        return ChangedRows(pa.array([], pa.large_binary()), stream(None))
    if max_bytes is not None:
        changes = len(inserts) - int(np.count_nonzero(inserts))
        estimate = tail.nbytes + len(inserts) * 2 + changes * _FOLD_OVERHEAD
        if estimate > max_bytes:
            raise TailTooLong(f"folding the {changes} updates and deletes of the changelog [{start}, {at}) "
                              f"would hold about {estimate:,} bytes (at most {max_bytes:,})")
    keys = encode_key_array(tail, primary_key)
    others = ~inserts
    touched = pc.unique(keys.filter(pa.array(others)))  # keys an update or delete touched
    in_touched = pc.is_in(keys, value_set=touched).to_numpy(zero_copy_only=False)
    plain = inserts & ~in_touched  # inserted and left alone since: their rows as they are
    involved = np.flatnonzero(in_touched)
    encoded = pc.dictionary_encode(keys.take(pa.array(involved)))
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    last = np.full(len(encoded.dictionary), -1, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    # the rows left: the untouched inserts and each touched key's last change if it is no removal
    keep = plain.copy()
    latest = involved[last]
    keep[latest[(kinds[latest] == changetype.INSERT) | (kinds[latest] == changetype.UPDATE_AFTER)]] = True
    values = _ordered_values(tail.column(primary_key[0]).filter(pa.array(others))) \
        if len(primary_key) == 1 else None
    return ChangedRows(encoded.dictionary, stream(keep), None if values is None else np.unique(values))


def read_at(image: Image | None, image_offset: int, log: LogTablet, at: int, primary_key: Sequence[str],
            columns: Sequence[str], filter: Predicate | None = None, limit: int | None = None, *,
            where: str = "log", exact: bool = True, max_bytes: int | None = None) -> Iterator[pa.RecordBatch]:
    """The rows at log offset ``at`` (only ``columns``, exactly ``filter``, at most ``limit``),
    from ``image`` (the rows at ``image_offset``; None means an empty bucket at that offset) and
    the changelog ``[image_offset, at)``. ``filter`` must be bound to the table schema.
    ``exact=False`` uses ``filter`` only to skip image batches by their statistics (the caller
    filters the rows again; ``limit`` then counts unfiltered rows). The changelog's keys are read
    (and :class:`TailTooLong` raised, see :func:`changed_rows`) before this returns; its rows are
    read again as they are sent."""
    wanted = list(columns)
    needed = list(dict.fromkeys(wanted + (sorted(filter.columns()) if filter is not None and exact else [])))
    changes = changed_rows(log, image_offset, at, primary_key, needed, where, max_bytes)
    return _merge(image, changes, primary_key, wanted, needed, filter, limit, exact)


def _unchanged(column: pa.Array, changes: ChangedRows) -> pa.Array:
    """A mask of the image rows (``column``: their encoded keys, or their single key column when
    ``changes.sorted_values`` is set) whose key the changelog tail did not touch."""
    touched = changes.sorted_values
    if touched is None:
        return pc.invert(pc.is_in(column, value_set=changes.keys))
    values = _ordered_values(column)  # ascending: the image is in key order
    keep = np.ones(len(values), dtype=bool)
    if len(values):
        lo = np.searchsorted(touched, values[0], side="left")
        hi = np.searchsorted(touched, values[-1], side="right")
        candidates = touched[lo:hi]
        positions = np.searchsorted(values, candidates)
        inside = positions < len(values)
        positions = positions[inside]
        keep[positions[values[positions] == candidates[inside]]] = False
    return pa.array(keep)


_AHEAD = 2  # image batches filtered ahead of the one being sent
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _ahead(items: Iterator[pa.RecordBatch], fn: Callable[[pa.RecordBatch], pa.RecordBatch]
           ) -> Iterator[pa.RecordBatch]:
    """``fn`` of each of ``items``, in order, computed up to :data:`_AHEAD` items ahead in a small
    shared pool (Arrow kernels release the GIL); a task never waits on another."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-merge")
        pool = _pool
    pending: collections.deque[Future] = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > _AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def _merge(image: Image | None, changes: ChangedRows, primary_key: Sequence[str], wanted: list[str],
           needed: list[str], filter: Predicate | None, limit: int | None,
           exact: bool = True) -> Iterator[pa.RecordBatch]:
    expression = filter.to_arrow() if filter is not None and exact else None
    remaining = limit

    def emit(batch: pa.RecordBatch | pa.Table) -> Iterator[pa.RecordBatch]:
        nonlocal remaining
        if expression is not None:
            batch = batch.filter(expression)
        if remaining is not None:
            batch = batch.slice(0, remaining)
            remaining -= batch.num_rows
        if batch.num_rows:
            parts = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
            for part in parts:
                yield part.select(wanted)

    if image is not None:
        names = image.schema.names
        fields = [names.index(c) for c in needed]
        if not changes.empty:
            by_value = changes.sorted_values is not None
            fields.append(names.index(primary_key[0]) if by_value else image.key_index)
        def pieces() -> Iterator[pa.RecordBatch]:
            for whole in image.batches(fields, filter):
                # (an image written before batches were cut by bytes may hold wide ones: filtering
                # copies, so a slice at a time)
                step = memory.rows_within(whole.nbytes / max(1, whole.num_rows), max(1, whole.num_rows))
                for first in range(0, whole.num_rows, step):
                    yield whole.slice(first, step)

        def unchanged(batch: pa.RecordBatch) -> pa.RecordBatch:
            keep = _unchanged(batch.column(len(fields) - 1), changes)
            return batch.filter(keep).select(list(range(len(needed))))

        # Dropping the changed keys copies each image batch: the next ones are filtered in the
        # background while this one is sent (a batch or two ahead: bounded memory).
        batches = pieces() if changes.empty else _ahead(pieces(), unchanged)
        try:
            for batch in batches:
                yield from emit(batch)
                if remaining is not None and remaining <= 0:
                    return
        finally:
            if hasattr(batches, "close"):
                batches.close()
    for batch in changes.batches():
        yield from emit(batch.select(needed))
        if remaining is not None and remaining <= 0:
            return
