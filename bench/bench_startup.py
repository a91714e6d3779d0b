"""Start-up speed (issue 12): opening a data directory whose log holds 1M records vs one of 10k.

The issue states this ratio (flightstore against itself by design): start-up of a 1M-record data
directory within 2x of a 10k-record one, i.e. independent of the record count. Start-up is measured
in a fresh process, from ``Store(data_dir)`` to a table that answers: open the store, open the table
(its log), ``COUNT(*)`` and read its newest record. Interleaved rounds, best of each.

Records of 10 rows are written through the segment API with one encoded payload (the bytes are
those an append of that batch writes; 1M ``LogTablet.append`` calls would take minutes), in
segments of the default size (256 MiB: 1M records make six). The directories are closed cleanly;
after a crash the active segment is verified record by record, so that start-up grows with the
size of the active segment (at most ``table.log.segment.bytes``), not with the number of records.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pyarrow as pa

from bench.report import Row
from flightstore.catalog import read_table_dir
from flightstore.log.record import RecordHeader, encode_payload, encode_record, payload_checksums
from flightstore.log.segment import Segment
from flightstore.store import Store

HERE = Path(__file__).parent
SMALL, LARGE = 10_000, 1_000_000
SEGMENT_BYTES = 256 * 1024 * 1024  # the default of table.log.segment.bytes
ROUNDS = 5
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.int64()), ("amount", pa.float64()),
                    ("status", pa.string())])

_OPEN = """
import sys, time
from flightstore.store import Store
t0 = time.perf_counter()  # after the imports: what a data directory costs, not Python's start
with Store(sys.argv[1], fsync=False) as store:
    table = store.table("events")
    count = table.row_count()
    end = table.end_offsets()[0]
    newest = list(table.read_changelog(0, end - 10))
assert count == int(sys.argv[2]) * 10 and newest[0].num_rows == 10, (count, newest)
print(time.perf_counter() - t0)
"""


def _write_records(directory: Path, count: int) -> None:
    """``count`` records of one 10-row batch, rolling segments at the default size, closed."""
    batch = pa.record_batch({"id": list(range(10)), "user": [7] * 10, "amount": [1.5] * 10,
                             "status": ["paid"] * 10}, schema=SCHEMA)
    payload = encode_payload(batch)
    checksums = tuple(payload_checksums(payload, SCHEMA))
    crc = zlib.crc32(payload)
    active = Segment.create(directory, 0)
    for number in range(count):
        base, ts = number * 10, 1_700_000_000_000 + number
        header = encode_record(base, 10, ts, None, None, b"", payload, checksums, active.size, crc)
        if active.size and active.size + len(header) + payload.size > SEGMENT_BYTES:
            active.seal(fsync=False)
            active.close()
            active = Segment.create(directory, base)
            header = encode_record(base, 10, ts, None, None, b"", payload, checksums, 0, crc)
        position = active.append(header, payload)
        active.add(RecordHeader(base, 10, ts, None, None, {}, position, position + len(header),
                                payload.size, crc, checksums))
    active.checkpoint(fsync=False)
    active.close()


def _build(data_dir: Path, count: int) -> None:
    with Store(data_dir, fsync=False) as store:
        store.create_table("events", SCHEMA)
        log_dir = read_table_dir(data_dir, "events") / "bucket-0" / "log"
    shutil.rmtree(log_dir)
    log_dir.mkdir()
    _write_records(log_dir, count)


def _start_up(data_dir: Path, count: int) -> float:
    done = subprocess.run([sys.executable, "-c", _OPEN, str(data_dir), str(count)],
                          capture_output=True, text=True, timeout=600, cwd=HERE.parent, check=False)
    if done.returncode:
        raise RuntimeError(f"start-up of {data_dir} failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip())


def _best(dirs: dict[int, Path]) -> dict[int, float]:
    best = {count: float("inf") for count in dirs}
    for _ in range(ROUNDS):
        for count, data_dir in dirs.items():
            best[count] = min(best[count], _start_up(data_dir, count))
    return best


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        dirs = {SMALL: root / "small", LARGE: root / "large"}
        for count, data_dir in dirs.items():
            _build(data_dir, count)
        best = _best(dirs)
        return [Row("start-up + COUNT + newest record, 1M-record log", best[LARGE] * 1000,
                    best[SMALL] * 1000, "ms", "same, 10k-record log", higher_is_better=False,
                    goal=">=0.5x")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
