"""Write many log records fast, in the real format, through the segment API.

``LogTablet.append`` costs ~100 us per record (validation, statistics, encoding); tests that need
100k records write one encoded payload again and again with fresh headers instead: the files are
byte for byte what appends of that batch would have written, only the timestamps are given.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa

from flightstore.log.record import RecordHeader, encode_payload, encode_record, payload_checksums
from flightstore.log.segment import Segment


def write_records(directory: Path, batch: pa.RecordBatch, count: int, *, segment_bytes: int,
                  timestamps=None, writer_every: int = 0) -> list[Segment]:
    """``count`` records of ``batch`` in ``directory`` (rolling at ``segment_bytes``), closed
    cleanly (sealed segments have summaries, the last one a checkpoint). ``timestamps(i)`` gives
    record i's timestamp; ``writer_every`` > 0 tags every n-th record with writer "w" and sequence."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = encode_payload(batch)
    checksums = tuple(payload_checksums(payload, batch.schema))
    crc = zlib.crc32(payload)
    segments = [Segment.create(directory, 0)]
    rows = batch.num_rows
    for i in range(count):
        base = i * rows
        ts = timestamps(i) if timestamps else 1_000 + i
        writer, sequence = ("w", i) if writer_every and i % writer_every == 0 else (None, None)
        active = segments[-1]
        header = encode_record(base, rows, ts, writer, sequence, b"", payload, checksums,
                               active.size, crc)
        if active.size and active.size + len(header) + payload.size > segment_bytes:
            active.seal(fsync=False)
            active = Segment.create(directory, base)
            segments.append(active)
            header = encode_record(base, rows, ts, writer, sequence, b"", payload, checksums, 0, crc)
        position = active.append(header, payload)
        active.add(RecordHeader(base, rows, ts, writer, sequence, {}, position,
                                position + len(header), payload.size, crc, checksums))
    segments[-1].checkpoint(fsync=False)
    for segment in segments:
        segment.close()
    return segments
