"""Operations on a whole data directory: ``flightstore verify`` and ``flightstore repair``.

``verify`` checks every CRC and checksum the data directory holds (the catalog, every log record,
index and summary, every intent, every KV block, and the lake files of datalake-enabled tables:
:mod:`flightstore.lake.verify`) and cross-checks the KV's applied offsets against
the logs. It changes nothing and runs while no server holds the directory (a shared lock on
``DATA_DIR/LOCK``). Findings are errors (data lost or unreadable), warnings (fixed by the next open
without losing anything acknowledged) and notes.

``repair`` takes the directory's exclusive lock (like a server), then table by table: rewrites the
log segments that hold bad bytes, declaring the offsets they held lost and moving the bytes to
``quarantine/``; declares the offsets a primary-key table's KV applied past the log's end; rebuilds
a corrupt KV from its log when the log is complete; opens the table (recovery replays the log past
the declared ranges); and completes a primary-key table's changelog from its KV so that it folds to
the KV again. Every step says which offsets of which table and bucket were lost.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightstore.catalog import read_catalog_file, table_directory
from flightstore.errors import DataDirectoryInUse, FlightstoreError, NotFound
from flightstore.intents import IntentLog
from flightstore.kv.integrity import check_kv, reconcile_changelog
from flightstore.log.integrity import Finding, check_log, repair_log
from flightstore.log.segment import QUARANTINE
from flightstore.partitioned import partition_directory
from flightstore.partitioning import bucket_id
from flightstore.progress import QUIET, Steps
from flightstore.schema import TableDescriptor, TablePath
from flightstore.store import Store

__all__ = ["Finding", "Report", "repair", "verify"]


@dataclass
class Report:
    """Findings of a verify or repair run, in order."""

    findings: list[Finding] = field(default_factory=list)

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def add(self, severity: str, where: str, message: str) -> None:
        self.findings.append(Finding(severity, where, message))

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)

    @property
    def ok(self) -> bool:
        return self.count("error") == 0

    def summary(self) -> str:
        return (f"{self.count('error')} error(s), {self.count('warning')} warning(s), "
                f"{self.count('note')} note(s)")


@dataclass(frozen=True)
class _TableFiles:
    path: TablePath
    descriptor: TableDescriptor
    directory: Path

    def buckets(self) -> list[tuple[int, Path, str]]:
        """``(number, directory, label)`` of every bucket; a partitioned table's by table-wide
        number, in its partitions' directories."""
        d = self.descriptor
        if not d.is_partitioned:
            return [(b, self.directory / f"bucket-{b}", f"table {self.path} bucket {b}")
                    for b in range(d.num_buckets)]
        return [(bucket_id(p.id, b, d.num_buckets), partition_directory(self.directory, p.id) / f"bucket-{b}",
                 f"table {self.path} partition {p.name} bucket {b}")
                for p in sorted(d.partitions, key=lambda p: p.id) for b in range(d.num_buckets)]

    def label(self, number: int) -> str:
        return {b: label for b, _, label in self.buckets()}[number]


def _tables(data_dir: Path, report: Report,
            only: Iterable[str] | None = None) -> list[_TableFiles]:
    catalog = data_dir / "catalog.json"
    if not catalog.exists():
        report.add("error", str(data_dir), "no catalog.json: not a flightstore data directory")
        return []
    try:
        _, databases = read_catalog_file(catalog)
    except FlightstoreError as exc:
        report.add("error", str(data_dir), str(exc))
        return []
    wanted = None if only is None else {TablePath.parse(name, "default") for name in only}
    found = []
    for database in sorted(databases):
        for table, entry in sorted(databases[database].items()):
            path = TablePath(database, table)
            if wanted is not None and path not in wanted:
                continue
            try:
                descriptor = TableDescriptor.from_json(entry["descriptor"])
                directory = table_directory(data_dir, entry["dir"])
            except (ValueError, KeyError, TypeError) as exc:
                report.add("error", f"table {path}", f"its catalog entry is corrupt: {exc}")
                continue
            if not directory.is_dir():
                report.add("error", f"table {path}", f"its data directory {entry['dir']} is missing")
                continue
            found.append(_TableFiles(path, descriptor, directory))
    if wanted is not None:
        for missing in sorted(wanted - {t.path for t in found}, key=str):
            if not any(f.where == f"table {missing}" for f in report.findings):
                raise NotFound(f"table {missing} does not exist in {data_dir}")
    return found


def _shared_lock(data_dir: Path) -> int | None:
    """A shared lock on ``DATA_DIR/LOCK`` (None when there is no lock file: nothing ever opened
    the directory); DataDirectoryInUse when a Store holds it."""
    try:
        fd = os.open(data_dir / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise DataDirectoryInUse(f"data directory {data_dir} is open in a flightstore server (pid "
                                 f"{holder or 'unknown'}); stop it before verifying") from None
    return fd


def verify(data_dir: str | os.PathLike, options: Mapping[str, Any] | None = None,
           steps: Steps = QUIET) -> Report:
    """Check everything in ``data_dir``, the lake files of its datalake-enabled tables included
    (where the lake is: server ``options``, default the embedded lake); change nothing. ``steps``
    hears of each bucket (and the lake) as it is checked (:mod:`flightstore.progress`)."""
    data_dir = Path(data_dir)
    report = Report()
    if not data_dir.is_dir():
        report.add("error", str(data_dir), "no such directory")
        return report
    lock = _shared_lock(data_dir)
    try:
        tables = _tables(data_dir, report)
        lake = [t for t in tables if t.descriptor.option("table.datalake.enabled")]
        steps.start(sum(len(t.buckets()) for t in tables) + (1 if lake else 0), "verify")
        for table in tables:
            for _, directory, label in table.buckets():
                steps.advance(0, f"verify {label}")
                log_dir = directory / "log"
                if not log_dir.is_dir():
                    if table.descriptor.is_partitioned and not directory.parent.exists():
                        report.add("warning", label, "the partition has no directory yet (added while "
                                                     "the table was not open, or a crash right after; "
                                                     "created empty when the table opens)")
                        continue
                    report.add("error", label, "the log directory is missing")
                    continue
                log = check_log(log_dir, label)
                report.extend(log.findings)
                if table.descriptor.has_primary_key:
                    report.extend(check_kv(directory / "kv", label, log).findings)
                kept = sorted((log_dir / QUARANTINE).glob("*")) if (log_dir / QUARANTINE).is_dir() \
                    else []
                if kept:
                    report.add("note", label, f"{len(kept)} file(s) of bad bytes kept in "
                                              f"{log_dir / QUARANTINE}")
                steps.advance()
            intents = IntentLog(table.directory / "intent")
            for aside in intents.set_aside_files():
                report.add("note", f"table {table.path}",
                           f"a write intent that could not be applied was set aside as {aside}: that "
                           "unacknowledged write stays in the buckets that applied it before (see "
                           "the server log); delete the file once read")
            state = intents.inspect()
            if state == "torn":
                report.add("warning", f"table {table.path}",
                           "the intent log holds a torn record (a multi-bucket write that never "
                           "started; discarded at the next open)")
            elif state == "pending":
                report.add("note", f"table {table.path}", "a multi-bucket write is pending in the "
                                                          "intent log (completed at the next open)")
        if lake:
            steps.advance(0, "verify the lake files")
            _verify_lake(data_dir, lake, options, report)
            steps.advance()
    finally:
        if lock is not None:
            os.close(lock)
    return report


def _verify_lake(data_dir: Path, tables: list[_TableFiles], options: Mapping[str, Any] | None,
                 report: Report) -> None:
    """Check the lake files of datalake-enabled ``tables`` (:mod:`flightstore.lake.verify`)."""
    if not tables:
        return
    from flightstore.lake import LakeCatalog, LakeSettings
    from flightstore.lake.verify import verify_lake
    settings = LakeSettings.from_options(data_dir, options)
    if settings.catalog_uri.startswith("sqlite:///") and \
            not Path(settings.catalog_uri[len("sqlite:///"):]).exists():
        return  # the embedded lake was never created: nothing was tiered
    catalog = LakeCatalog(settings)
    try:
        for severity, where, message in verify_lake(catalog, [(t.descriptor, t.directory.name) for t in tables]):
            report.add(severity, where, message)
    finally:
        catalog.reset()


def repair(data_dir: str | os.PathLike, tables: Iterable[str] | None = None, *,
           fsync: bool = True, steps: Steps = QUIET) -> Report:
    """Repair ``tables`` (default: every table) of ``data_dir``; see the module doc. ``steps``
    hears of each bucket as it is repaired, and of each table's open."""
    data_dir = Path(data_dir)
    report = Report()
    if not (data_dir / "catalog.json").exists():
        report.add("error", str(data_dir), "no catalog.json: not a flightstore data directory")
        return report
    store = Store(data_dir, fsync=fsync)  # the exclusive lock: no server may run meanwhile
    try:
        found = _tables(data_dir, report, tables)
        steps.start(sum(len(t.buckets()) + 1 for t in found), "repair")
        for table in found:
            _repair_table(store, table, report, steps)
    finally:
        store.close()
    return report


def _repair_table(store: Store, table: _TableFiles, report: Report, steps: Steps = QUIET) -> None:
    losses: dict[int, list[tuple[int, int]]] = {}
    applied: dict[int, int | None] = {}
    for bucket, directory, label in table.buckets():
        steps.advance(1, f"repair {label}")
        log_dir = directory / "log"
        if table.descriptor.is_partitioned and not directory.parent.exists():
            continue  # a partition without a directory yet: nothing to repair, the open creates it
        kv = None
        if table.descriptor.has_primary_key:
            kv = check_kv(directory / "kv", label, None)
            applied[bucket] = kv.applied
        done, losses[bucket] = repair_log(log_dir, label, extend_to=applied.get(bucket),
                                          fsync=store.fsync)
        report.extend(done)
        if kv is not None and kv.corrupt:
            after = check_log(log_dir, label)
            if after.start_offset == 0 and not after.holes and not after.declared:
                kept = directory / QUARANTINE / f"kv-{int(time.time() * 1000)}"
                kept.parent.mkdir(exist_ok=True)
                shutil.move(str(directory / "kv"), kept)
                report.add("note", label, f"the corrupt KV was moved to {kept} and is rebuilt "
                                          "from the complete log")
                applied[bucket] = 0
            else:
                report.add("error", label, "the KV is corrupt and the log is not complete from "
                                           "offset 0: the KV cannot be rebuilt from it")
                return
    steps.advance(1, f"open table {table.path}")
    try:
        opened = store.table(table.path)
    except FlightstoreError as exc:
        report.add("error", f"table {table.path}", f"still does not open: {exc}")
        return
    report.add("note", f"table {table.path}", "opens and recovers")
    if not table.descriptor.has_primary_key:
        return
    for bucket, declared in losses.items():
        if not declared:
            continue
        label = table.label(bucket)
        before = applied.get(bucket) or 0
        missed = [(start, stop) for start, stop in declared if stop > before]
        for start, stop in missed:
            report.add("note", label, f"the KV had not applied offsets {max(start, before)}.."
                                      f"{stop - 1} before they were lost: it misses those changes")
        kv = opened.tablets()[bucket][1]
        if kv.log.start_offset > 0:
            report.add("note", label, "the changelog is not complete from offset 0: it was not "
                                      "reconciled with the KV")
            continue
        result = reconcile_changelog(kv)
        if result is not None:
            rows, base = result
            report.add("note", label, f"the changelog was completed from the KV: {rows} row(s) "
                                      f"at offsets {base}..{base + rows - 1} so that it folds to "
                                      "the KV again")
