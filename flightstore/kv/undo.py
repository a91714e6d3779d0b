"""Undo recovery: take back what a failed writer wrote after its last checkpoint (exactly-once).

A job writes with ``(writer_id, sequence)`` and commits a checkpoint now and then. When it fails
and restarts from checkpoint ``c``, its batches after ``c`` are already in the table but will be
produced again (possibly cut differently, or with other events). :func:`undo_writer` reads every
bucket's changelog, takes the writer's records with ``sequence > c`` newest first and restores their
before-images bypassing the merge engine (``+I`` -> delete the key; ``-U``/``+U`` -> put the ``-U``
row back; ``-D`` -> put the deleted row back). It then resets the writer's sequence to ``c`` so the
replay is accepted. It needs ``'table.changelog.image' = 'FULL'`` (the ``-U`` before-images).

The restore goes through :meth:`KvTablet.apply` in overwrite mode, so it is itself in the changelog
(under writer id ``undo:<writer_id>``, no sequence) and downstream readers see the retraction; the
KV still equals the fold of its changelog.

Idempotence and crashes. Per bucket, after the restore, one RocksDB WriteBatch stores the *undo
fence* (meta key ``undo:<writer_id>`` = the log end offset and ``c``) together with the writer's
reset sequence. Records before the fence are settled: everything of the writer after ``c`` there was
undone, so a later undo only looks at records from the fence on. A crash between the restore and
the fence makes the next undo restore the same before-images again, which is harmless: restores are
absolute values applied oldest-wins, so the result does not depend on the state they start from.
An undo to a sequence before an earlier undo's target is refused (checkpoints only move forward).
The fence lives in RocksDB meta only: :meth:`KvTablet.rebuild` from the log forgets it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from rocksdict import WriteBatch

from flightstore import changetype
from flightstore.errors import InvalidInput, Unsupported
from flightstore.log import LogBatch

if TYPE_CHECKING:
    from flightstore.kv.tablet import KvTablet
    from flightstore.store import Table

__all__ = ["UNDO_WRITER_PREFIX", "before_images", "undo_fence", "undo_writer"]

UNDO_WRITER_PREFIX = "undo:"
_FENCE = b"undo:"
_WRITER = b"writer:"  # KvTablet's meta key of a writer's last applied sequence
_PAIR = struct.Struct(">qq")
_INT = struct.Struct(">q")


def undo_fence(kv: KvTablet, writer_id: str) -> tuple[int, int | None]:
    """``(log offset, target sequence)`` of the writer's last undo in this bucket, or ``(0, None)``."""
    raw = kv._meta.get(_FENCE + writer_id.encode())
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


def _settle(kv: KvTablet, writer_id: str, after_sequence: int) -> None:
    """One WriteBatch: the undo fence at the log end and the writer's sequence reset."""
    write = WriteBatch(raw_mode=True)
    write.put(_FENCE + writer_id.encode(), _PAIR.pack(kv.log.end_offset, after_sequence), kv._meta_cf)
    last = kv.writer_sequence(writer_id)
    if last is not None and last > after_sequence:
        if after_sequence < 0:
            write.delete(_WRITER + writer_id.encode(), kv._meta_cf)
        else:
            write.put(_WRITER + writer_id.encode(), _INT.pack(after_sequence), kv._meta_cf)
    kv._db.write(write)


def _check_held(table: Table, bucket: int, kv: KvTablet, writer_id: str, after_sequence: int,
                fence: int) -> None:
    """Refuse an undo whose records may be gone: the changelog below the oldest KV snapshot may be
    deleted by ``table.log.ttl``. Safe when the log still starts at the fence, when the bucket has
    nothing of the writer after ``after_sequence``, or when a held record of the writer is at or
    below ``after_sequence + 1`` (the first batch to undo or an earlier one: the writer's later
    records follow it in the log)."""
    log = table.logs[bucket]
    last = kv.writer_sequence(writer_id)
    if log.start_offset <= fence or last is None or last <= after_sequence:
        return
    if any(r.writer_id == writer_id and r.sequence is not None and r.sequence <= after_sequence + 1
           for r in log.read(log.start_offset, columns=[])):
        return
    raise InvalidInput(f"table {table.path} bucket {bucket}: the changelog that undoing writer {writer_id!r} "
                       f"after sequence {after_sequence} needs may have expired (the log starts at offset "
                       f"{log.start_offset}); nothing was undone")


def undo_writer(table: Table, writer_id: str, after_sequence: int) -> int:
    """Undo every batch ``writer_id`` wrote with a sequence above ``after_sequence``.

    Returns the number of rows restored. Afterwards the table expects the writer's batch
    ``after_sequence + 1`` next. Raises Unsupported on a log table and InvalidInput when the
    changelog lacks before-images or the target precedes an earlier undo's target; both are
    checked before anything is written.
    """
    if not table.has_primary_key:
        raise Unsupported(f"undo needs a primary-key table; {table.path} is a log table")
    if table.descriptor.option("table.changelog.image") != "FULL":
        raise InvalidInput(f"table {table.path}: undo needs 'table.changelog.image' = 'FULL' (the -U "
                           "before-images)")
    if not isinstance(writer_id, str) or writer_id.startswith(UNDO_WRITER_PREFIX):
        raise InvalidInput(f"cannot undo writer {writer_id!r}")
    after_sequence = int(after_sequence)
    restored = 0
    with table._lock:
        fences = [undo_fence(kv, writer_id) for kv in table.kvs]
        for offset, target in fences:
            if target is not None and after_sequence < target:
                raise InvalidInput(f"table {table.path}: writer {writer_id!r} was already undone to "
                                   f"sequence {target}; cannot undo to the earlier {after_sequence}")
        for bucket, kv in enumerate(table.kvs):
            _check_held(table, bucket, kv, writer_id, after_sequence, fences[bucket][0])
        for bucket, kv in enumerate(table.kvs):
            with kv._lock:
                records = [r for r in table.logs[bucket].read(fences[bucket][0])
                           if r.writer_id == writer_id and r.sequence is not None
                           and r.sequence > after_sequence]
                rows, kinds = before_images(records, table.schema)
                if rows.num_rows:
                    kv.apply(rows, kinds, None, writer_id=UNDO_WRITER_PREFIX + writer_id,
                             overwrite=True)
                    restored += rows.num_rows
                _settle(kv, writer_id, after_sequence)
        if after_sequence < 0:
            table._writers.pop(writer_id, None)
        elif table._writers.get(writer_id, -1) > after_sequence:
            table._writers[writer_id] = after_sequence
    return restored
