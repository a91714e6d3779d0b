"""The commit step of a write that spans buckets: recorded as an intent, committed bucket by bucket,
rolled forward when storage fails part-way (the design and why forward: :mod:`flightstore.intents`).

A table write (``Table`` or ``PartitionedTable``) first prepares every bucket it touches
(:meth:`~flightstore.table.writes.TableWrites._prepare_buckets`, one :class:`BucketWrite` each:
nothing is applied, every value-dependent check is done). A write of several buckets then goes
through :meth:`PendingWrites._commit_all_or_nothing`: the intent is recorded, the write becomes the
table's :class:`PendingWrite`, and :meth:`PendingWrites._roll_forward` commits it. While a
pending write exists (storage failed in the middle), every write, writer-sequence query and undo
first completes it (:meth:`PendingWrites._settle_pending`), and refuses with
:class:`~flightstore.errors.WriteIncomplete` if it still cannot.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.errors import InvalidInput, WriteIncomplete
from flightstore.intents import BUCKET_COLUMN, FORMAT
from flightstore.kv.writes import PreparedWrite, changelog_schema
from flightstore.schema import conform

# Set while a table rolls a pending write intent forward on open: its buckets' replicas have no
# role yet (what it writes is truncated later if this server turns out not to lead).
REPLAYING_INTENT: ContextVar[bool] = ContextVar("replaying_intent", default=False)

__all__ = ["BucketWrite", "PendingWrite", "PendingWrites"]

log = logging.getLogger("flightstore.intents")


@dataclass
class BucketWrite:
    """One bucket's prepared part of a table write, not applied yet.

    ``record`` is what the bucket commits and what an intent records: the changelog of a KV
    bucket (table columns plus ``_change_type``) or the rows a log bucket appends. ``prepared``
    is the KV bucket's :class:`~flightstore.kv.tablet.PreparedWrite` (None: rebuilt from
    ``record`` when committed). ``partition`` is the partition id of the bucket's unit in a
    partitioned table.
    """

    bucket: int
    record: pa.Table
    prepared: PreparedWrite | None = None
    duplicate: bool = False
    partition: int | None = None


@dataclass
class PendingWrite:
    """A multi-bucket write whose intent is recorded and that not every bucket committed yet."""

    writer_id: str
    sequence: int
    timestamp_ms: int
    kv: bool
    parts: list[BucketWrite] = field(default_factory=list)


class PendingWrites:
    """Recording, committing and rolling forward multi-bucket writes (mixed into
    :class:`~flightstore.store.Table`; ``PartitionedTable`` overrides the three hooks at the end)."""

    _pending: PendingWrite | None = None

    def _commit_all_or_nothing(self, parts: list[BucketWrite], kv: bool, writer_id: str, sequence: int,
                               now_ms: int, result: dict) -> None:
        """Record the intent of prepared ``parts`` (several buckets), then commit them (under the
        table lock). Raises WriteIncomplete when storage fails part-way: the write stays pending."""
        result.duplicate = any(p.duplicate for p in parts)
        todo = [p for p in parts if not p.duplicate]
        if not todo:
            return
        records = [p.record.append_column(BUCKET_COLUMN, pa.array(
            np.full(p.record.num_rows, self._table_bucket(p.partition, p.bucket), np.int32)))
            for p in todo]
        self._intents.begin({"format": FORMAT, "kv": kv, "writer_id": writer_id, "sequence": sequence,
                             "timestamp_ms": now_ms}, pa.concat_tables(records))
        self._pending = PendingWrite(writer_id, sequence, now_ms, kv, todo)
        self._roll_forward(result)

    def _settle_pending(self) -> None:
        """Complete the table's pending write, if any, before anything else changes the table;
        raises WriteIncomplete when it still cannot be completed."""
        if self._pending is not None:
            for part in self._pending.parts:
                part.prepared = None  # computed before the failure: rebuilt from the record,
                part.record = self._conformed(part.record)  # under the schema of now (ALTER)
            try:
                self._roll_forward({})
            except WriteIncomplete as exc:
                raise WriteIncomplete(f"nothing was done: an earlier write is incomplete: {exc}") from exc

    def _roll_forward(self, result: dict) -> None:
        """Commit the pending write to every bucket that lacks it, fsync their logs, clear the
        intent. Offsets of the committed buckets go into ``result`` (table-wide numbers)."""
        pending = self._pending
        current = None
        try:
            for part in pending.parts:
                current = part
                unit = self._unit_of(part.partition)
                if unit is None or unit._bucket_has(part.bucket, pending.writer_id, pending.sequence):
                    continue  # a dropped partition took its rows along; or applied already
                result[self._table_bucket(part.partition, part.bucket)] = unit._commit_bucket(
                    part, pending.writer_id, pending.sequence, pending.timestamp_ms)
            current = None
            for part in pending.parts:  # the intent may go only once every bucket has the write
                unit = self._unit_of(part.partition)
                if unit is not None:
                    unit.logs[part.bucket].sync()
        except Exception as exc:  # noqa: BLE001 - storage (OSError, RocksDB's plain Exception)
            where = "" if current is None else \
                f" bucket {self._table_bucket(current.partition, current.bucket)}"
            raise WriteIncomplete(
                f"table {self.path}: batch {pending.sequence} of writer {pending.writer_id!r} is "
                f"recorded but{where} could not apply it ({type(exc).__name__}: {exc}); it will be "
                "completed, not undone, before the table's next write or at its next open (until "
                "then writes are refused); retry with the same writer id and sequence to be told "
                "once it is complete") from exc
        self._intents.complete()
        self._pending = None
        self._note_sequence(pending.writer_id, pending.sequence, pending.timestamp_ms)

    def _complete_pending_write(self) -> None:
        """On open: complete the write the intent log recorded, if any (see
        :mod:`flightstore.intents`). Never raises for the write itself: a write that storage still
        cannot complete stays pending (writes are refused until it completes), one that cannot be
        applied on its values (InvalidInput) is set aside; the table opens either way. Corruption
        met on the way (CorruptData, DataLoss) is raised, as any read of the table would."""
        found = self._intents.pending()
        if found is None:
            self._intents.complete()  # empty, or torn: a write that never touched a bucket
            return
        meta, record = found
        token = REPLAYING_INTENT.set(True)  # at open no replica has a role yet (see table/writes.py)
        try:
            if meta.get("format") == FORMAT:
                self._pending = PendingWrite(meta["writer_id"], int(meta["sequence"]),
                                             int(meta["timestamp_ms"]), bool(meta["kv"]),
                                             self._recorded_parts(record))
                self._roll_forward({})
            else:
                self._replay_input_intent(meta, record)
        except WriteIncomplete as exc:
            log.error("table %s: the write intent %s could not be completed at open (%s); the table "
                      "serves reads and completes it before its next write", self.path,
                      self._intents.path, exc)
        except InvalidInput as exc:  # value-dependent (overflow, refusal, a schema it no longer fits)
            self._pending = None
            aside = self._intents.set_aside()
            log.error("table %s: the write intent of writer %r batch %s cannot be applied (%s: %s); "
                      "set aside as %s; the table opens without it (buckets that applied it before "
                      "keep it)", self.path, meta.get("writer_id"), meta.get("sequence"),
                      type(exc).__name__, exc, aside)
        finally:
            REPLAYING_INTENT.reset(token)

    def _replay_input_intent(self, meta: dict, record: pa.Table) -> None:
        """An intent of an older version records the write's input rows: prepare it again (buckets
        holding its sequence skip it), all buckets before any commits, so a value-dependent
        refusal (raised here) changes nothing more than before."""
        kinds = None
        if meta["kv"]:
            kinds = record.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
            record = record.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        target = tuple(meta["target"]) if meta["target"] else None
        self._apply_buckets(record, kinds, target, meta["writer_id"], meta["sequence"],
                            meta["overwrite"], recovering=True)
        self._intents.complete()

    def _recorded_parts(self, record: pa.Table) -> list[BucketWrite]:
        """The parts of a recorded intent, by bucket, conformed to the current schema."""
        buckets = record.column(BUCKET_COLUMN).to_numpy(zero_copy_only=False)
        rows = self._conformed(record.drop_columns([BUCKET_COLUMN]))
        parts = []
        for bucket in np.unique(buckets):
            partition, local = self._split_table_bucket(int(bucket))
            parts.append(BucketWrite(local, rows.filter(pa.array(buckets == bucket)), partition=partition))
        return parts

    def _conformed(self, rows: pa.Table) -> pa.Table:
        """Recorded rows (a changelog, or a log table's rows) as the table's current schema holds
        them: columns added since are null, widened ones cast."""
        target = changelog_schema(self.schema) if changetype.CHANGE_TYPE_COLUMN in rows.column_names \
            else self.schema
        return rows if rows.schema == target else conform(rows, target, target.names)

    # ---- hooks: where a bucket lives (a partitioned table has units) ---------------------------
    def _unit_of(self, partition: int | None) -> Any:
        """The table unit holding the buckets of ``partition`` (None: it was dropped)."""
        return self

    def _table_bucket(self, partition: int | None, bucket: int) -> int:
        """The table-wide number of ``bucket`` of ``partition``'s unit."""
        return bucket

    def _split_table_bucket(self, bucket: int) -> tuple[int | None, int]:
        return None, bucket
