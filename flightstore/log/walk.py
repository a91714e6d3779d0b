"""Walking a segment's records: tell a torn tail from corruption in the middle.

A record that fails its checks is either the *torn tail* of the file (an incomplete last write: no
valid record follows it) or *corruption* (valid records follow). To tell them apart the walk scans
forward from the bad bytes for a later record whose header checks (magic, header CRC, a base offset
not below the expected one, and, when payloads are verified, its payload CRC). If one is found, the
bytes in between are damage: the offsets from the expected one up to that record's base offset are
lost, and every later record is kept with its own offsets. If none is found, the bad bytes are a
torn tail, which the caller may cut.

Two consecutive good records whose offsets do not meet (``base_offset`` above the previous
``next_offset``) are damage too, without bad bytes: the log lost offsets there.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from flightstore.log.record import MAGIC, RecordHeader, read_header

__all__ = ["Damage", "Walk", "walk_records"]

_SCAN_CHUNK = 1 << 20


@dataclass(frozen=True)
class Damage:
    """Offsets ``[start_offset, end_offset)`` lost; their bytes were ``[start_position,
    end_position)`` of the file (an empty byte range when only offsets are missing)."""

    start_offset: int
    end_offset: int
    start_position: int
    end_position: int
    reason: str


@dataclass
class Walk:
    """The good records found, the damage between them, and a torn tail if any."""

    records: list[RecordHeader] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    torn_position: int | None = None  # the torn tail runs from here to the end of the file
    end_position: int = 0
    next_offset: int = 0
    bytes_read: int = 0


def walk_records(pread: Callable[[int, int], bytes], file_size: int, start_position: int,
                 expected_offset: int, verify_payload: bool) -> Walk:
    """Walk the records of a file from ``start_position``, where ``expected_offset`` starts.

    ``verify_payload`` also checks every payload's CRC (recovery of the active segment, verify);
    without it only headers are checked (their CRC covers offsets, lengths and statistics).
    """
    walk = Walk(end_position=start_position, next_offset=expected_offset)

    def counted(size: int, position: int) -> bytes:
        data = pread(size, position)
        walk.bytes_read += len(data)
        return data

    position, expected = start_position, expected_offset
    while position < file_size:
        header, why = _check(counted, position, file_size, expected, verify_payload)
        if header is not None:
            if header.base_offset > expected:
                walk.damage.append(Damage(expected, header.base_offset, position, position,
                                          "offsets missing between two records"))
            walk.records.append(header)
            position, expected = header.end_position, header.next_offset
            continue
        found = _next_record(counted, position + 1, file_size, expected, verify_payload)
        if found is None:
            walk.torn_position = position
            break
        walk.damage.append(Damage(expected, found.base_offset, position, found.position,
                                  f"{why} at byte {position}"))
        walk.records.append(found)
        position, expected = found.end_position, found.next_offset
    walk.end_position, walk.next_offset = position, expected
    return walk


def _check(pread: Callable[[int, int], bytes], position: int, file_size: int, expected: int,
           verify_payload: bool) -> tuple[RecordHeader | None, str]:
    header = read_header(pread, position, file_size)
    if header is None:
        return None, "a record header that is torn or fails its CRC"
    if header.base_offset < expected:
        return None, f"a record header with offset {header.base_offset} below {expected}"
    if verify_payload and header.payload_len and zlib.crc32(
            pread(header.payload_len, header.payload_position)) != header.payload_crc:
        return None, (f"a record (offsets {header.base_offset}..{header.next_offset - 1}) whose "
                      "payload fails its CRC")
    return header, ""


def _next_record(pread: Callable[[int, int], bytes], position: int, file_size: int, expected: int,
                 verify_payload: bool) -> RecordHeader | None:
    """The first record at or after ``position`` that checks, scanning for its magic."""
    while position < file_size:
        chunk = pread(min(_SCAN_CHUNK + len(MAGIC) - 1, file_size - position), position)
        at = chunk.find(MAGIC)
        while at != -1:
            header, _ = _check(pread, position + at, file_size, expected, verify_payload)
            if header is not None:
                return header
            at = chunk.find(MAGIC, at + 1)
        position += _SCAN_CHUNK
    return None
