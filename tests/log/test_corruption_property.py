"""Property: one flipped byte anywhere in a log costs at most the record that holds it.

After any single-byte corruption, and whether the writer closed cleanly or was killed, every record
that does not hold the byte reads back exactly, the record that holds it reads back exactly or
raises DataLoss, and a read across the whole log is exact or DataLoss: never a short or wrong
answer. (A killed writer's last record may be cut as a torn tail: it was the unfinished write.)
"""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.errors import DataLoss
from flightstore.log import LogTablet
from flightstore.log.segment import segment_name
from flightstore.log.walk import walk_records

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
SIZES = [7, 30, 1, 64, 12]


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, start + n)),
                            "name": [f"name-{i}" if i % 3 else None for i in range(start, start + n)],
                            "score": [i / 4 for i in range(start, start + n)]}, schema=SCHEMA)


def _rows(tablet: LogTablet, lower: int, upper: int, columns=None) -> list[dict]:
    return [r for b in tablet.read(lower, to_offset=upper, columns=columns)
            for r in b.batch.to_pylist()]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(min_value=0, max_value=1, exclude_max=True), mask=st.integers(1, 255),
       killed=st.booleans(), compression=st.sampled_from(["NONE", "ZSTD"]))
def test_one_flipped_byte_costs_at_most_its_record(tmp_path_factory, where: float, mask: int,
                                                    killed: bool, compression: str) -> None:
    directory = tmp_path_factory.mktemp("log")
    expected, bounds = [], []
    with LogTablet(directory, SCHEMA, fsync=False, compression=compression) as tablet:
        base = 0
        for n in SIZES:
            tablet.append(_batch(base, n))
            expected.extend(_batch(base, n).to_pylist())
            bounds.append((base, base + n))
            base += n
    path = directory / f"{segment_name(0)}.log"
    with open(path, "rb") as handle:
        fd = handle.fileno()
        walked = walk_records(lambda n, p: os.pread(fd, n, p), os.fstat(fd).st_size, 0, 0, True)
    data = bytearray(path.read_bytes())
    position = int(where * len(data))
    data[position] ^= mask
    path.write_bytes(bytes(data))
    hit = next(i for i, r in enumerate(walked.records) if position < r.end_position)
    if killed:
        for summary in directory.glob("*.summary"):
            summary.unlink()
    try:
        with LogTablet(directory, SCHEMA, compression=compression) as tablet:
            cut = killed and hit == len(SIZES) - 1 and tablet.end_offset == bounds[hit][0]
            for i, (lower, upper) in enumerate(bounds):
                if cut and i == hit:
                    assert _rows(tablet, lower, upper) == []  # a torn tail, cut
                    continue
                for columns in (["name"], None):  # a column-pruned read, then a whole one
                    want = [{c: r[c] for c in columns or r} for r in expected[lower:upper]]
                    try:
                        assert _rows(tablet, lower, upper, columns) == want, (i, hit, columns)
                    except DataLoss:
                        assert i == hit, f"record {i} lost for a byte in record {hit}"
            try:
                got = _rows(tablet, 0, tablet.end_offset)
                assert got == expected[:bounds[hit][0]] if cut else got == expected
            except DataLoss:
                pass
    finally:
        shutil.rmtree(directory)
