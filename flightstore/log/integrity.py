"""Checking and repairing a bucket's log files offline (``flightstore verify`` / ``repair``).

:func:`check_log` reads every byte of every segment (header and payload CRCs, offset continuity,
index and summary sidecars) and changes nothing. :func:`repair_log` makes a damaged log readable
again without deleting a valid record: each segment holding bad bytes is rewritten with its good
records, the offsets the bad bytes held become a *lost-range record* (declared, with the reason), and
the bad bytes are moved to ``quarantine/``. Offsets no segment holds (a missing segment, a log that
ends before what a KV applied) are declared lost the same way. Afterwards reads skip the declared
ranges instead of raising :class:`~flightstore.errors.DataLoss`.
"""

from __future__ import annotations

import os
import shutil
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from flightstore.log.index import INDEX_ENTRY, fsync_directory, read_summary
from flightstore.log.record import RecordHeader, encode_lost_range, encode_record, read_header
from flightstore.log.segment import Segment, quarantine, segment_name
from flightstore.log.walk import Walk, walk_records

__all__ = ["Finding", "LogCheck", "check_log", "log_segments", "repair_log"]

_MAX_LOST_RECORD = 0xFFFFFFFF  # num_rows is a u32


@dataclass(frozen=True)
class Finding:
    """One thing found: ``error`` (data lost or unreadable), ``warning`` (repaired by itself at the
    next open, nothing acknowledged lost) or ``note`` (informational, e.g. a loss already declared)."""

    severity: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity.upper():7} {self.where}: {self.message}"


@dataclass
class LogCheck:
    """What :func:`check_log` found in one log directory."""

    findings: list[Finding] = field(default_factory=list)
    start_offset: int = 0
    end_offset: int = 0  # where the log continues (known ends included)
    holes: list[tuple[int, int]] = field(default_factory=list)  # lost, not declared
    declared: list[tuple[int, int, str]] = field(default_factory=list)


def log_segments(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending."""
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def _walk(path: Path, base: int, verify_payload: bool = True) -> Walk:
    with open(path, "rb") as handle:
        fd = handle.fileno()
        return walk_records(lambda n, p: os.pread(fd, n, p), os.fstat(fd).st_size, 0, base,
                            verify_payload)


def _index_bytes(records: list[RecordHeader]) -> bytes:
    entries, ts = [], None
    for record in records:
        ts = record.timestamp_ms if ts is None else max(ts, record.timestamp_ms)
        entries.append(INDEX_ENTRY.pack(record.base_offset, record.position, ts))
    return b"".join(entries)


def check_log(directory: Path, label: str) -> LogCheck:
    """Check every record, sidecar and offset of the log in ``directory``; change nothing."""
    check = LogCheck()

    def add(severity: str, message: str) -> None:
        check.findings.append(Finding(severity, label, message))

    bases = log_segments(directory)
    if not bases:
        add("error", f"no segment file in {directory.name}/")
        return check
    check.start_offset = expected = bases[0]
    for number, base in enumerate(bases):
        last = number == len(bases) - 1
        path = directory / f"{segment_name(base)}.log"
        if base > expected:
            add("error", f"offsets {expected}..{base - 1} are lost: no segment holds them")
            check.holes.append((expected, base))
        elif base < expected:
            add("error", f"{path.name} starts at offset {base}, inside the previous segment "
                         f"(which reaches {expected})")
        walk = _walk(path, base)
        for damage in walk.damage:
            check.holes.append((damage.start_offset, damage.end_offset))
            what = (f"bytes {damage.start_position}..{damage.end_position - 1} of {path.name}"
                    if damage.end_position > damage.start_position else path.name)
            add("error", f"offsets {damage.start_offset}..{damage.end_offset - 1} are lost: "
                         f"{damage.reason} ({what}); the records after them are intact")
        for record in walk.records:
            if record.lost is not None:
                check.declared.append((record.base_offset, record.next_offset, record.lost))
                add("note", f"offsets {record.base_offset}..{record.next_offset - 1} were "
                            f"declared lost by repair: {record.lost}")
        size = path.stat().st_size
        summary, _ = read_summary(directory / f"{segment_name(base)}.summary")
        if summary is not None and summary.base_offset != base:
            summary = None
        end = walk.next_offset
        if walk.torn_position is not None:
            cut = size - walk.torn_position
            bad = f"{cut} bytes at byte {walk.torn_position} of {path.name}"
            if last and (summary is None or summary.size <= walk.torn_position):
                add("warning", f"a torn tail of {bad} (an unfinished write, cut at the next open)")
            elif not last and bases[number + 1] > end:
                add("error", f"offsets {end}..{bases[number + 1] - 1} are lost: {bad} are "
                             "unreadable and no valid record follows them")
                check.holes.append((end, bases[number + 1]))
                end = bases[number + 1]
            else:
                add("error", f"{bad} are unreadable and no valid record follows them")
        if last and summary is not None and summary.next_offset > end:
            add("error", f"offsets {end}..{summary.next_offset - 1} are lost: the log held them "
                         f"at its last clean close ({path.name} was cut or damaged since)")
            check.holes.append((end, summary.next_offset))
            end = summary.next_offset
        for start, stop in (summary.holes if summary is not None else []):
            if (start, stop) not in check.holes and start >= walk.next_offset:
                check.holes.append((start, stop))
        if not walk.damage and (last or walk.torn_position is None):
            # (a damaged segment's sidecars describe the records it lost too)
            _check_sidecars(directory, base, walk, summary, last, add)
        expected = end
    check.end_offset = expected
    return check


def _check_sidecars(directory: Path, base: int, walk: Walk, summary, last: bool, add) -> None:
    name = segment_name(base)
    expected = _index_bytes(walk.records)
    try:
        index = (directory / f"{name}.index").read_bytes()
    except FileNotFoundError:
        index = None
    if index is None or index[:len(expected)] != expected or (not last and index != expected):
        add("warning", f"{name}.index is missing or stale (rebuilt from the records when needed)")
    if summary is None:
        if not last:
            add("warning", f"{name}.summary is missing or corrupt (the segment is walked once at "
                           "the next open and gets a new one)")
        return
    covered = [r for r in walk.records if r.end_position <= summary.size]
    consistent = (len(covered) == summary.records and
                  (not covered or covered[-1].end_position == summary.size) and
                  zlib.crc32(_index_bytes(covered)) == summary.index_crc)
    if not consistent or (not last and summary.size != walk.end_position):
        add("error" if not last else "warning",
            f"{name}.summary disagrees with the records of {name}.log")


def repair_log(directory: Path, label: str, *, extend_to: int | None = None,
               fsync: bool = True) -> tuple[list[Finding], list[tuple[int, int]]]:
    """Make the log in ``directory`` readable again, losing no valid record; return what was done
    and the offset ranges ``[start, end)`` it declared lost.

    ``extend_to``: the offset a primary-key table's KV applied; when the log ends before it, the
    missing offsets are declared lost too (new changes then continue after them, as the KV expects).
    The log must not be open (the caller holds the data directory's lock).
    """
    done: list[Finding] = []
    declared: list[tuple[int, int]] = []
    bases = log_segments(directory)
    expected = bases[0] if bases else 0
    for number, base in enumerate(bases):
        last = number == len(bases) - 1
        path = directory / f"{segment_name(base)}.log"
        if base > expected:
            _write_segment(directory, expected, [], [(expected, base, "no segment held them")],
                           None, sealed=True, fsync=fsync)
            done.append(Finding("note", label, f"offsets {expected}..{base - 1} declared lost "
                                               "(no segment held them)"))
            declared.append((expected, base))
        if base < expected:
            done.append(Finding("error", label, f"{path.name} overlaps the previous segment; "
                                                "not repaired"))
            return done, declared
        walk = _walk(path, base)
        summary, _ = read_summary(directory / f"{segment_name(base)}.summary")
        end = walk.next_offset
        if last and summary is not None and summary.base_offset == base:
            end = max(end, summary.next_offset)
        if last and extend_to is not None:
            end = max(end, extend_to)
        if not last:
            end = bases[number + 1]  # whatever the segment lost up to the next one
        if walk.damage or (walk.torn_position is not None and not last) or end > walk.next_offset:
            lost = [(d.start_offset, d.end_offset, f"{d.reason} in {path.name}")
                    for d in walk.damage]
            if end > walk.next_offset:
                if not last:
                    why = f"unreadable bytes at the end of {path.name}"
                elif summary is not None and summary.next_offset >= end:
                    why = "the log held them at its last clean close and lost them since"
                else:
                    why = f"the log ended before offset {end}, up to which the KV had applied it"
                lost.append((walk.next_offset, end, why))
            for start, stop, why in lost:
                done.append(Finding("note", label, f"offsets {start}..{stop - 1} declared lost "
                                                   f"({why})"))
                declared.append((start, stop))
            for kept in _quarantine_bad_bytes(directory, path, walk):
                done.append(Finding("note", label, f"bad bytes moved to {kept}"))
            _write_segment(directory, base, walk.records, lost, path, sealed=not last,
                           fsync=fsync)
        elif walk.torn_position is not None:  # a torn tail of the last segment: cut it
            with open(path, "rb") as handle:
                handle.seek(walk.torn_position)
                kept = quarantine(directory, path.name, walk.torn_position, handle.read())
            os.truncate(path, walk.torn_position)
            done.append(Finding("note", label, f"cut a torn tail at byte {walk.torn_position} of "
                                               f"{path.name} (kept in {kept})"))
        expected = end
    return done, declared


def _quarantine_bad_bytes(directory: Path, path: Path, walk: Walk) -> list[Path]:
    kept = []
    with open(path, "rb") as handle:
        ranges = [(d.start_position, d.end_position) for d in walk.damage
                  if d.end_position > d.start_position]
        if walk.torn_position is not None:
            ranges.append((walk.torn_position, os.fstat(handle.fileno()).st_size))
        for start, stop in ranges:
            handle.seek(start)
            kept.append(quarantine(directory, path.name, start, handle.read(stop - start)))
    return kept


def _write_segment(directory: Path, base: int, records: list[RecordHeader],
                   lost: list[tuple[int, int, str]], source: Path | None, *, sealed: bool,
                   fsync: bool) -> None:
    """Write segment ``base`` anew: ``records`` (copied from ``source``) and lost-range records
    for ``lost``, in offset order; then replace the old files."""
    work = directory / "repair.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    segment = Segment.create(work, base)
    items = sorted([(r.base_offset, r) for r in records] + [(start, (start, stop, why))
                                                           for start, stop, why in lost],
                   key=lambda item: item[0])
    ts = 0
    with open(source, "rb") if source is not None else open(os.devnull, "rb") as old:
        for _, item in items:
            if isinstance(item, RecordHeader):
                ts = max(ts, item.timestamp_ms)
                _copy_record(segment, old, item)
            else:
                start, stop, why = item
                while start < stop:
                    count = min(stop - start, _MAX_LOST_RECORD)
                    _add_lost(segment, start, count, ts, why)
                    start += count
    if sealed:
        segment.seal(fsync)
    else:
        segment.checkpoint(fsync)
    segment.close()
    name = segment_name(base)
    (directory / f"{name}.summary").unlink(missing_ok=True)
    for suffix in (".log", ".index", ".summary"):
        os.replace(work / f"{name}{suffix}", directory / f"{name}{suffix}")
    if fsync:
        fsync_directory(directory)
    shutil.rmtree(work)


def _copy_record(segment: Segment, old, record: RecordHeader) -> None:
    old.seek(record.payload_position)
    payload = old.read(record.payload_len)
    if record.lost is not None:
        _add_lost(segment, record.base_offset, record.num_rows, record.timestamp_ms, record.lost)
        return
    header = encode_record(record.base_offset, record.num_rows, record.timestamp_ms,
                           record.writer_id, record.sequence, record.stats_raw, payload,
                           record.checksums, segment.size, record.payload_crc)
    position = segment.append(header, payload)
    segment.add(replace(record, position=position, payload_position=position + len(header)))


def _add_lost(segment: Segment, start: int, count: int, ts: int, why: str) -> None:
    header = encode_lost_range(start, count, ts, why, segment.size)
    position = segment.append(header)
    parsed = read_header(lambda n, p: header[p - position:p - position + n], position,
                         position + len(header))
    assert parsed is not None and parsed.lost is not None
    segment.add(parsed)
