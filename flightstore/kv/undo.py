"""Undo recovery: take back what a failed writer wrote after its last checkpoint, and only that.

A job writes with ``(writer_id, sequence)`` and commits a checkpoint now and then. When it fails
and restarts from checkpoint ``c``, its batches after ``c`` are already in the table but will be
produced again (possibly cut differently, or with other events). :func:`undo_writer` removes that
writer's contribution from every bucket, leaving what other writers wrote since, so the result is
the fold of the changelog without the undone batches. It reads the changelog (so it needs
``'table.changelog.image' = 'FULL'``: the ``-U`` before-images), and per key the writer's records
with ``sequence > c`` touched:

* **nobody else wrote the key since** the writer's first undone record: the key gets back the
  before-image of that record (``+I`` -> no row; ``-U``/``+U`` -> the ``-U`` row; ``-D`` -> the
  deleted row). This is exact for every merge engine;
* **another writer wrote it since** (a record of any other writer id after the first undone one):
  on an aggregation table whose changed fields are *invertible* (``sum``, ``product``: see
  :mod:`flightstore.kv.merge.aggregate`) the writer's share is retracted: each undone change's
  contribution (after - before, after / before) is summed per key and taken out of the current
  value, and a field that held no value before the writer's first undone record and that no later
  record of another writer changed becomes null again. Any other case (another engine, a
  non-invertible field such as ``max`` or ``listagg``, a deletion) is refused, naming the keys and
  fields, before anything is written.

What the changelog cannot show, undo cannot see: a write that changed nothing left no record (for
example another writer adding 0 to a sum, or upserting the row it already had), and another
writer's retraction (``-U``/``-D`` input) on a key only the undone writer had created reads as an
upsert of the negated value. Float sums are retracted in float arithmetic.

The restore goes through :meth:`KvTablet.apply` in overwrite mode, so it is itself in the changelog
(under the writer id ``undo:<c>:<writer_id>``, no sequence) and downstream readers see the
retraction; the KV still equals the fold of its changelog. Per bucket, afterwards, one RocksDB
write stores the *undo fence* (meta key ``undo:<writer_id>`` = log end offset and ``c``) with the
writer's reset sequence. Records before the fence are settled. A crash between the restore and the
fence leaves the restore record in the log: the next undo treats that record as the fence, so
nothing is taken back twice. An undo to a sequence before an earlier undo's target is refused
(checkpoints only move forward).

Callers hold the table's write lock (no write may land between reading the changelog and the
restore) and keep the table's own writer registry in step (:meth:`flightstore.store.Table.undo`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.errors import InvalidInput, Unsupported
from flightstore.kv.encoding import encode_key_array
from flightstore.kv.tablet import UNDO_FENCE_PREFIX, KvTablet
from flightstore.log import LogBatch

__all__ = [
    "UNDO_WRITER_PREFIX",
    "before_images",
    "check_undoable",
    "restore_writer_id",
    "undo_fence",
    "undo_writer",
]

UNDO_WRITER_PREFIX = "undo:"
_FENCE = UNDO_FENCE_PREFIX  # + writer id, in the KV meta column family (dropped on expiry)
_PAIR = struct.Struct(">qq")
_MAX_NAMED = 5  # keys named in a refusal


def restore_writer_id(writer_id: str, target: int) -> str:
    """The writer id of the restore record of an undo of ``writer_id`` to ``target``."""
    return f"{UNDO_WRITER_PREFIX}{target}:{writer_id}"


def _parse_restore(record_writer: str | None) -> tuple[int, str] | None:
    """``(target, undone writer)`` of a restore record's writer id, None for other records."""
    if record_writer is None or not record_writer.startswith(UNDO_WRITER_PREFIX):
        return None
    target, _, writer = record_writer[len(UNDO_WRITER_PREFIX):].partition(":")
    try:
        return int(target), writer
    except ValueError:
        return None


def undo_fence(kv: KvTablet, writer_id: str) -> tuple[int, int | None]:
    """``(log offset, target sequence)`` of the writer's last settled undo in this bucket, or
    ``(0, None)``."""
    raw = kv.meta(_FENCE + writer_id.encode())
    if raw is None:
        return 0, None
    offset, target = _PAIR.unpack(raw)
    return offset, target


def before_images(records: list[LogBatch], schema: pa.Schema) -> tuple[pa.Table, np.ndarray]:
    """Rows and change types that restore the state before ``records`` (given in log order).

    Records are taken newest first, so with last-row-wins per key the OLDEST record's before-image
    is what a key ends with. Inside one record a key appears once (one changelog group per key).
    """
    parts, kinds = [], []
    for record in reversed(records):
        batch = pa.Table.from_batches([record.batch])
        codes = batch.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
        restore = np.full(len(codes), -1, dtype=np.int8)
        restore[codes == changetype.INSERT] = changetype.DELETE
        restore[(codes == changetype.UPDATE_BEFORE) | (codes == changetype.DELETE)] = \
            changetype.UPDATE_AFTER
        keep = restore >= 0
        parts.append(batch.select(schema.names).filter(pa.array(keep)).cast(schema))
        kinds.append(restore[keep])
    if not parts:
        return schema.empty_table(), np.zeros(0, dtype=np.int8)
    return pa.concat_tables(parts), np.concatenate(kinds)


# ---- one bucket -------------------------------------------------------------------------------

@dataclass
class _BucketUndo:
    """What undoing the writer in one bucket writes: restore rows (overwrite mode) and kinds."""

    kv: KvTablet
    rows: pa.Table
    kinds: np.ndarray


def _records_to_undo(kv: KvTablet, writer_id: str, after_sequence: int
                     ) -> tuple[int, int | None, list[LogBatch]]:
    """The bucket's fence offset, the earlier undo's target and the changelog records from the
    writer's first record to undo on. Records before the fence are settled: the fence in meta, or a
    later restore record of this writer whose fence a crash kept from being written. Headers are
    walked first (no column is read), so only the records since the first undone one are loaded."""
    fence, target = undo_fence(kv, writer_id)
    start = None
    for record in kv.log.read(fence, columns=[]):
        restore = _parse_restore(record.writer_id)
        if restore is not None and restore[1] == writer_id:
            fence, target, start = record.next_offset, restore[0], None
            continue
        if start is None and record.writer_id == writer_id and record.sequence is not None \
                and record.sequence > after_sequence:
            start = record.base_offset
    return fence, target, [] if start is None else list(kv.log.read(start))


def _check_held(kv: KvTablet, writer_id: str, after_sequence: int, fence: int) -> None:
    """Refuse an undo whose records may be gone: the changelog below the oldest KV snapshot may be
    deleted by ``table.log.ttl``. Safe when the log still starts at the fence, when the bucket has
    nothing of the writer after ``after_sequence``, or when a held record of the writer is at or
    below ``after_sequence + 1`` (the first batch to undo or an earlier one: the writer's later
    records follow it in the log)."""
    log = kv.log
    last = kv.writer_sequence(writer_id)
    if log.start_offset <= fence or last is None or last <= after_sequence:
        return
    if any(r.writer_id == writer_id and r.sequence is not None and r.sequence <= after_sequence + 1
           for r in log.read(log.start_offset, columns=[])):
        return
    raise InvalidInput(f"table {kv.descriptor.path} bucket {kv.bucket}: the changelog that undoing "
                       f"writer {writer_id!r} after sequence {after_sequence} needs may have expired "
                       f"(the log starts at offset {log.start_offset}); nothing was undone")


def _pairs(rows: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """For the changelog ``rows`` of one or more records: the rows that carry a key's new state
    (+I, +U, -D) and the row of the state before each (-1: none, i.e. +I). A -D's new state is
    'no row'; its before is the -D row itself."""
    kinds = rows.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
    index = np.arange(len(kinds))
    after = np.flatnonzero((kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER)
                           | (kinds == changetype.DELETE))
    before = np.full(len(after), -1, dtype=np.int64)
    updates = kinds[after] == changetype.UPDATE_AFTER
    previous = np.maximum(after - 1, 0)
    has_before = updates & (kinds[previous] == changetype.UPDATE_BEFORE)
    before[has_before] = index[previous[has_before]]
    deletes = kinds[after] == changetype.DELETE
    before[deletes] = after[deletes]
    return after, before


def _changed(rows: pa.Table, after: np.ndarray, before: np.ndarray, column: str) -> np.ndarray:
    """Per pair: did the column's value change (null-safe; -D and +I compare with nothing)?"""
    kinds = rows.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)[after]
    values = rows.column(column)
    new = values.take(pa.array(after))
    old = pc.take(values, pa.array(before, mask=before < 0))
    new = pc.if_else(pa.array(kinds == changetype.DELETE), pa.nulls(len(after), new.type), new)
    differ = pc.fill_null(pc.not_equal(new, old), True)
    same_null = pc.and_(pc.is_null(new), pc.is_null(old))
    return pc.and_not(differ, same_null).to_numpy(zero_copy_only=False)


def _describe_keys(rows: pa.Table, primary_key: Sequence[str], positions: np.ndarray) -> str:
    keys = rows.select(list(primary_key)).take(pa.array(positions[:_MAX_NAMED])).to_pylist()
    text = ", ".join(str(tuple(k.values())) if len(k) > 1 else repr(next(iter(k.values())))
                     for k in keys)
    return text + (f" and {len(positions) - _MAX_NAMED} more" if len(positions) > _MAX_NAMED else "")


def _plan_bucket(kv: KvTablet, writer_id: str, after_sequence: int,
                 records: list[LogBatch]) -> _BucketUndo:
    """The restore of one bucket, or InvalidInput when a key cannot be given back (nothing is
    written here)."""
    descriptor = kv.descriptor
    schema, pk = descriptor.schema, list(descriptor.primary_key)
    undone_at = [i for i, r in enumerate(records)  # records[0] is the first one, if any
                 if r.writer_id == writer_id and r.sequence is not None and r.sequence > after_sequence]
    empty = _BucketUndo(kv, schema.empty_table(), np.zeros(0, dtype=np.int8))
    if not undone_at:
        return empty
    since = records[undone_at[0]:]  # what happened from the first undone record on
    undone = np.zeros(len(since), dtype=bool)
    undone[[i - undone_at[0] for i in undone_at]] = True
    rows = pa.Table.from_batches([r.batch for r in since])
    record_of = np.repeat(np.arange(len(since)), [r.batch.num_rows for r in since])
    by_undone = undone[record_of]
    keys = encode_key_array(rows, pk).dictionary_encode()
    key_of = keys.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    num_keys = len(keys.dictionary)
    never = np.iinfo(np.int64).max
    first_undone = np.full(num_keys, never, dtype=np.int64)
    np.minimum.at(first_undone, key_of[by_undone], record_of[by_undone])
    last_other = np.full(num_keys, -1, dtype=np.int64)
    np.maximum.at(last_other, key_of[~by_undone], record_of[~by_undone])
    touched = first_undone < never
    contested = touched & (last_other > first_undone)

    # Keys nobody else wrote since: their before-images, exactly.
    images, kinds = before_images([since[i - undone_at[0]] for i in undone_at], schema)
    if images.num_rows:
        image_keys = encode_key_array(images, pk)
        positions = pc.index_in(image_keys, keys.dictionary).to_numpy(zero_copy_only=False)
        keep = ~contested[positions]
        images, kinds = images.filter(pa.array(keep)), kinds[keep]
    if not contested.any():
        return _BucketUndo(kv, images, kinds)
    retracted = _retract_contested(kv, writer_id, rows, by_undone, record_of, key_of, first_undone,
                                   contested)
    rows_out = pa.concat_tables([images, retracted]) if images.num_rows else retracted
    kinds_out = np.concatenate([kinds, np.full(retracted.num_rows, changetype.UPDATE_AFTER, np.int8)])
    return _BucketUndo(kv, rows_out, kinds_out)


def _retract_contested(kv: KvTablet, writer_id: str, rows: pa.Table, by_undone: np.ndarray,
                       record_of: np.ndarray, key_of: np.ndarray, first_undone: np.ndarray,
                       contested: np.ndarray) -> pa.Table:
    """The rows of keys other writers also wrote after the undone writer: the current row with
    the undone writer's share of each invertible field taken out (InvalidInput otherwise)."""
    descriptor = kv.descriptor
    schema, pk = descriptor.schema, list(descriptor.primary_key)
    after, before = _pairs(rows)
    pair_key = key_of[after]
    of_contested = contested[pair_key]
    undone_pair = by_undone[after] & of_contested
    other_pair = ~by_undone[after] & of_contested & (record_of[after] > first_undone[pair_key])
    kinds = rows.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
    value_columns = [c for c in schema.names if c not in pk]
    changed = {c: _changed(rows, after, before, c) for c in value_columns}
    changed_by_undone = [c for c in value_columns if (changed[c] & undone_pair).any()]
    aggregators = getattr(kv.merger, "aggregators", {})
    deletes = undone_pair & (kinds[after] == changetype.DELETE)
    blocked = [c for c in changed_by_undone
               if c not in aggregators or not aggregators[c].invertible]
    if blocked or deletes.any() or not aggregators:
        bad = np.flatnonzero(undone_pair & np.logical_or.reduce(
            [changed[c] for c in blocked] + [deletes]))
        if not len(bad):
            bad = np.flatnonzero(undone_pair)
        keys = _describe_keys(rows, pk, after[bad])
        why = (f"the {descriptor.merge_engine} merge engine cannot take one writer's share out of a "
               "row" if not aggregators else
               f"field(s) {', '.join(repr(c) for c in blocked)} "
               f"({', '.join(aggregators[c].name for c in blocked if c in aggregators)}) cannot "
               "take back one writer's share" if blocked else "the writer deleted them")
        raise InvalidInput(f"table {descriptor.path} bucket {kv.bucket}: cannot undo writer "
                           f"{writer_id!r}: key(s) {keys} were written by other writers after it, "
                           f"and {why}; nothing was undone")
    # Group the contested keys; fetch their current rows.
    contested_ids = np.flatnonzero(contested)
    group_of_key = np.full(len(contested), -1, dtype=np.int64)
    group_of_key[contested_ids] = np.arange(len(contested_ids))
    first_row = np.full(len(contested), len(key_of), dtype=np.int64)
    np.minimum.at(first_row, key_of, np.arange(len(key_of)))
    key_rows = rows.select(pk).take(pa.array(first_row[contested_ids]))
    found, current = kv.lookup(key_rows)
    if not found.all():  # an aggregation row never goes away, except by a deletion refused above
        raise InvalidInput(f"table {descriptor.path} bucket {kv.bucket}: a key written since is "
                           "gone; nothing was undone")
    groups = group_of_key[pair_key[undone_pair]]
    undone_after, undone_before = after[undone_pair], before[undone_pair]
    # The state before the undone writer's first record on each key (None: the key did not exist).
    first_pair = np.full(len(contested_ids), len(after), dtype=np.int64)
    np.minimum.at(first_pair, groups, np.arange(len(after))[undone_pair])
    columns = []
    for name in schema.names:
        value = current.column(name).combine_chunks()
        if name in changed_by_undone:
            field = rows.column(name)
            new = field.take(pa.array(undone_after)).combine_chunks()
            old = pc.take(field, pa.array(undone_before, mask=undone_before < 0)).combine_chunks()
            aggregator = aggregators[name]
            share = aggregator.aggregate(aggregator.contribution(new, old), groups, len(contested_ids))
            value = aggregator.retract(value, share)
            start = before[first_pair]
            was_null = pc.is_null(pc.take(field, pa.array(start, mask=start < 0))).to_numpy(
                zero_copy_only=False)
            others_changed = np.zeros(len(contested_ids), dtype=bool)
            mask = other_pair & changed[name]
            others_changed[group_of_key[pair_key[mask]]] = True
            back_to_null = was_null & ~others_changed
            value = pc.if_else(pa.array(back_to_null), pa.nulls(len(value), value.type), value)
        columns.append(value)
    return pa.Table.from_arrays(columns, schema=schema)


# ---- the table ----------------------------------------------------------------------------------

def check_undoable(kvs: Sequence[KvTablet], writer_id: str) -> None:
    """Refuse an undo the table cannot do at all: Unsupported without KV buckets (a log table),
    InvalidInput without before-images or for a restore writer id."""
    if not kvs:
        raise Unsupported("undo needs a primary-key table; this is a log table")
    descriptor = kvs[0].descriptor
    if descriptor.option("table.changelog.image") != "FULL":
        raise InvalidInput(f"table {descriptor.path}: undo needs 'table.changelog.image' = 'FULL' "
                           "(the -U before-images)")
    if not isinstance(writer_id, str) or writer_id.startswith(UNDO_WRITER_PREFIX):
        raise InvalidInput(f"cannot undo writer {writer_id!r}")


def undo_writer(kvs: Sequence[KvTablet], writer_id: str, after_sequence: int) -> int:
    """Undo every batch ``writer_id`` wrote into the buckets ``kvs`` with a sequence above
    ``after_sequence``; returns the number of rows written to restore them.

    Everything is checked, and every bucket's restore computed, before anything is written:
    Unsupported on a log table (no ``kvs``), InvalidInput when the changelog lacks before-images,
    when the target precedes an earlier undo's target, or when a key cannot be given back (see the
    module docstring). Afterwards the buckets expect the writer's batch ``after_sequence + 1``.
    """
    check_undoable(kvs, writer_id)
    descriptor = kvs[0].descriptor
    after_sequence = int(after_sequence)
    plans = []
    for kv in kvs:
        fence, target, records = _records_to_undo(kv, writer_id, after_sequence)
        if target is not None and after_sequence < target:
            raise InvalidInput(f"table {descriptor.path}: writer {writer_id!r} was already undone to "
                               f"sequence {target}; cannot undo to the earlier {after_sequence}")
        _check_held(kv, writer_id, after_sequence, fence)
        plans.append(records)
    undos = [_plan_bucket(kv, writer_id, after_sequence, records) for kv, records in zip(kvs, plans)]
    restored = 0
    for undo in undos:
        if undo.rows.num_rows:
            undo.kv.apply(undo.rows, undo.kinds, None,
                          writer_id=restore_writer_id(writer_id, after_sequence), overwrite=True)
            restored += undo.rows.num_rows
        _settle(undo.kv, writer_id, after_sequence)
    return restored


def _settle(kv: KvTablet, writer_id: str, after_sequence: int) -> None:
    """One RocksDB write: the undo fence at the log end and the writer's sequence reset."""
    last = kv.writer_sequence(writer_id)
    writers: dict[str, int | None] = {}
    if last is not None and last > after_sequence:
        writers[writer_id] = None if after_sequence < 0 else after_sequence
    kv.write_meta({_FENCE + writer_id.encode(): _PAIR.pack(kv.log.end_offset, after_sequence)}, writers)
