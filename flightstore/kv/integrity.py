"""Checking a bucket's KV offline, and making its changelog fold to it again after a loss.

:func:`check_kv` opens RocksDB read-only and reads every key of every column family with checksum
verification (a corrupt SST block fails the iterator's status), counts the rows against the
maintained count, and compares the applied log offset with what the log holds. It changes nothing.

:func:`reconcile_changelog` is the primary-key half of ``flightstore repair``: once a lost range of
the changelog is declared, the fold of the changelog no longer equals the KV (the lost changes are
missing from it). The KV is the table's state, so the changelog is completed from it: the rows
where fold and KV differ are appended as one changelog record (``-D`` for keys the KV no longer
holds, ``+I`` for keys only the KV holds, ``-U``/``+U`` where values differ). Rebuilding the KV
from the log then gives the KV again, and changelog readers see the net effect of what was lost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from flightstore import changetype
from flightstore.kv.encoding import encode_keys
from flightstore.kv.tablet import _APPLIED, _INT, _ROWS, KvTablet
from flightstore.log.integrity import Finding, LogCheck

__all__ = ["KvCheck", "check_kv", "reconcile_changelog"]

_ROCKSDICT_CONFIG = "rocksdict-config.json"  # rewritten by every rocksdict open, even read-only


@dataclass
class KvCheck:
    """What :func:`check_kv` found: findings, and the applied offset (None if unreadable)."""

    findings: list[Finding] = field(default_factory=list)
    applied: int | None = None
    rows: int | None = None
    corrupt: bool = False


def check_kv(directory: Path, label: str, log: LogCheck | None) -> KvCheck:
    """Check every key and block of the KV in ``directory`` and its offsets against ``log``."""
    check = KvCheck()

    def add(severity: str, message: str) -> None:
        check.findings.append(Finding(severity, label, message))

    if not directory.is_dir():
        add("warning", "no KV directory (rebuilt from the log at the next open)")
        return check
    try:
        applied, counted, rows = _read_kv(directory)
    except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception for corruption
        check.corrupt = True
        add("error", f"the KV is unreadable: {str(exc).splitlines()[0]}")
        return check
    check.applied, check.rows = applied, rows
    if counted != rows:
        add("error", f"the KV holds {rows} rows but its maintained count says {counted} "
                     "(COUNT(*) would be wrong)")
    if log is None:
        return check
    if applied > log.end_offset:
        add("error", f"the KV applied the changelog up to offset {applied} but the log ends at "
                     f"{log.end_offset}: changelog offsets {log.end_offset}..{applied - 1} are "
                     "lost (the KV still holds the table's state)")
    elif applied < log.start_offset:
        add("error", f"the KV applied the changelog up to offset {applied} but the log starts at "
                     f"{log.start_offset}: the KV cannot catch up")
    for start, stop in log.holes:
        if stop > applied:
            add("error", f"the KV has not applied offsets {max(start, applied)}..{stop - 1}, which "
                         "are lost: the table does not open until `flightstore repair` declares "
                         "them (its KV then misses those changes)")
    return check


def _read_kv(directory: Path) -> tuple[int, int, int]:
    """(applied offset, maintained row count, rows counted) read with checksums verified."""
    config = directory / _ROCKSDICT_CONFIG
    saved = (config.read_bytes(), os.stat(config)) if config.exists() else None
    families = [name for name in Rdict.list_cf(str(directory)) if name != "default"]
    db = Rdict(str(directory), Options(raw_mode=True),
               column_families={name: Options(raw_mode=True) for name in families},
               access_type=AccessType.read_only())
    try:
        options = ReadOptions()
        options.set_verify_checksums(True)
        options.fill_cache(False)
        rows = _count(db.iter(options))
        for name in families:
            _count(db.get_column_family(name).iter(options))
        meta = db.get_column_family("meta") if "meta" in families else None
        applied = meta.get(_APPLIED) if meta is not None else None
        counted = meta.get(_ROWS) if meta is not None else None
    finally:
        db.close()
        if saved is not None:  # leave the directory exactly as it was
            if config.read_bytes() != saved[0]:
                config.write_bytes(saved[0])
            os.utime(config, ns=(saved[1].st_atime_ns, saved[1].st_mtime_ns))
    return (0 if applied is None else _INT.unpack(applied)[0],
            0 if counted is None else _INT.unpack(counted)[0], rows)


def _count(iterator) -> int:
    iterator.seek_to_first()
    count = 0
    while iterator.valid():
        count += 1
        iterator.next()
    iterator.status()  # raises on a checksum mismatch or I/O error met on the way
    return count


def reconcile_changelog(kv: KvTablet) -> tuple[int, int] | None:
    """Append the changelog rows that make the log fold to the KV again; returns (rows appended,
    first offset) or None when they already agree. The whole log is folded in memory: this is an
    offline repair step. Needs the log from offset 0 (a KV snapshot would be the base otherwise)."""
    schema = kv.schema
    with kv._lock:
        kv._open_now()
        fold_keys, fold_rows, fold_values = _fold(kv)
        stored = dict(kv._db.items())
        fold = dict(zip(fold_keys, range(len(fold_keys))))
        gone = [fold[k] for k in fold_keys if k not in stored]
        changed = [fold[k] for k in fold_keys if k in stored and stored[k] != fold_values[fold[k]]]
        new_values = [v for k, v in stored.items() if k not in fold]
        changed_values = [stored[fold_keys[i]] for i in changed]
        if not (gone or changed or new_values):
            return None
        parts, kinds = [], []

        def add(rows: pa.Table, kind: int) -> None:
            if rows.num_rows:
                parts.append(rows.cast(schema))
                kinds.append(np.full(rows.num_rows, kind, dtype=np.int8))

        add(fold_rows.take(pa.array(gone, pa.int64())), changetype.DELETE)
        if kv.full_image:
            add(fold_rows.take(pa.array(changed, pa.int64())), changetype.UPDATE_BEFORE)
        add(kv.codec.decode(changed_values), changetype.UPDATE_AFTER)
        add(kv.codec.decode(new_values), changetype.INSERT)
        changelog = pa.concat_tables(parts).append_column(
            pa.field(changetype.CHANGE_TYPE_COLUMN, pa.int8(), nullable=False),
            pa.array(np.concatenate(kinds), pa.int8()))
        base = kv.log.append(changelog)
        write = WriteBatch(raw_mode=True)
        write.put(_APPLIED, _INT.pack(kv.log.end_offset), kv._meta_cf)
        kv._db.write(write)
        return changelog.num_rows, base


def _fold(kv: KvTablet) -> tuple[list[bytes], pa.Table, list[bytes]]:
    """The changelog's fold: keys, rows and encoded values of the keys it leaves present."""
    batches = [record.batch for record in kv.log.read(kv.log.start_offset)]
    if not batches:
        return [], kv.schema.empty_table(), []
    table = pa.Table.from_batches(batches)
    kinds = table.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
    keep = kinds != changetype.UPDATE_BEFORE  # -U is followed by its +U
    table, kinds = table.filter(pa.array(keep)), kinds[keep]
    rows = table.drop_columns([changetype.CHANGE_TYPE_COLUMN])
    keys = encode_keys(rows, kv.primary_key)
    count = len(keys)
    reversed_keys = pa.array(keys[::-1], pa.binary()).dictionary_encode()
    _, first = np.unique(reversed_keys.indices.to_numpy(zero_copy_only=False), return_index=True)
    last = np.sort(count - 1 - first)
    present = last[kinds[last] != changetype.DELETE]
    fold_rows = rows.take(pa.array(present, pa.int64()))
    return [keys[i] for i in present], fold_rows, kv.codec.encode(fold_rows)
