"""A bucket's rows exactly at one log offset: a snapshot image merged with the changelog after it.

``rows(at) = image(S) - {keys changed in [S, at)} + {their last change in [S, at), if not a delete}``

The image (:mod:`flightstore.kv.image`) holds the rows at offset ``S``; the changelog records
``[S, at)`` carry full after-images, so the last change of a key in that range *is* its row at
``at`` (``+I``/``+U``) or says it is gone (``-D``; a ``-U`` is always followed by its ``+U``). No
RocksDB read and no lock is involved: the image is immutable and the log below ``at`` never changes,
so the result is the KV exactly at ``at`` whatever writes run meanwhile.

Everything is vectorized: the changelog tail is read column-pruned; its inserted rows no update or
delete touched since are taken as they are, the other keys are deduplicated with one dictionary
encoding of the encoded keys; each image batch drops the changed keys and applies
the filter with one Arrow expression. For a single integer or temporal key column (the image is
sorted by it) the changed keys are found by binary search (``np.searchsorted``) in the batch's key
column, else by one ``is_in`` over the encoded keys. Image batches come in key order, then the
changed rows (in the order of their last change).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.expressions import Predicate
from flightstore.kv.encoding import encode_key_array
from flightstore.kv.image import Image
from flightstore.log.held import read_held
from flightstore.log.tablet import LogTablet

__all__ = ["ChangedRows", "changed_rows", "read_at"]


class ChangedRows:
    """The net effect of a changelog range: every key it touched and the rows that key holds at
    the end of the range (keys whose last change removed them have no row)."""

    def __init__(self, keys: pa.Array, rows: pa.Table, sorted_values: np.ndarray | None = None) -> None:
        self.keys = keys  # encoded keys of every touched key (large_binary, distinct)
        self.rows = rows  # the current rows of the touched keys that still exist
        # With a single integer-like key column: its touched values, sorted (else None).
        self.sorted_values = sorted_values

    @property
    def empty(self) -> bool:
        return len(self.keys) == 0


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


def changed_rows(log: LogTablet, start: int, at: int, primary_key: Sequence[str],
                 columns: Sequence[str], where: str) -> ChangedRows:
    """The net changes of ``[start, at)`` in ``log``, with the table ``columns`` given (the primary
    key columns are read as well). Raises OffsetOutOfRange if the log no longer holds ``start``.

    A ``+I`` says its key held no row just before it, so a key whose only record in the range is
    a ``+I`` was absent at ``start`` and holds that record's row at ``at``: such rows are taken as
    they are and their keys are left out of :attr:`ChangedRows.keys` (no image row has them). Only
    the keys some ``-U``/``+U``/``-D`` touched are encoded and deduplicated; a range of inserts
    alone (a bulk load) costs no key encoding at all."""
    wanted = list(dict.fromkeys(list(columns) + list(primary_key)))
    stored = wanted + [changetype.CHANGE_TYPE_COLUMN]
    batches = [r.batch for r in read_held(log, start, where, columns=stored, to_offset=at)] \
        if at > start else []
    if not batches:
        return ChangedRows(pa.array([], pa.large_binary()), pa.table({c: [] for c in wanted}))
    tail = pa.Table.from_batches(batches)
    kinds = tail.column(changetype.CHANGE_TYPE_COLUMN).to_numpy()
    inserts = kinds == changetype.INSERT
    if inserts.all():
        return ChangedRows(pa.array([], pa.large_binary()), tail.select(wanted))
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
    # the rows in the order of their last change, the untouched inserts among them
    rows = np.sort(np.concatenate([np.flatnonzero(plain), involved[last]]))
    current = tail.take(pa.array(rows))
    kinds = kinds[rows]
    alive = (kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER)
    values = _ordered_values(tail.column(primary_key[0]).filter(pa.array(others))) \
        if len(primary_key) == 1 else None
    return ChangedRows(encoded.dictionary, current.filter(pa.array(alive)).select(wanted),
                       None if values is None else np.unique(values))


def read_at(image: Image | None, image_offset: int, log: LogTablet, at: int, primary_key: Sequence[str],
            columns: Sequence[str], filter: Predicate | None = None, limit: int | None = None, *,
            where: str = "log", exact: bool = True) -> Iterator[pa.RecordBatch]:
    """The rows at log offset ``at`` (only ``columns``, exactly ``filter``, at most ``limit``),
    from ``image`` (the rows at ``image_offset``; None means an empty bucket at that offset) and
    the changelog ``[image_offset, at)``. ``filter`` must be bound to the table schema.
    ``exact=False`` uses ``filter`` only to skip image batches by their statistics (the caller
    filters the rows again; ``limit`` then counts unfiltered rows)."""
    wanted = list(columns)
    needed = list(dict.fromkeys(wanted + (sorted(filter.columns()) if filter is not None and exact else [])))
    changes = changed_rows(log, image_offset, at, primary_key, needed, where)
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
        for batch in image.batches(fields, filter):
            if not changes.empty:
                keep = _unchanged(batch.column(len(fields) - 1), changes)
                batch = batch.filter(keep).select(list(range(len(needed))))
            yield from emit(batch)
            if remaining is not None and remaining <= 0:
                return
    if changes.rows.num_rows:
        yield from emit(changes.rows.select(needed))
