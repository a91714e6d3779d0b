"""Reading a bucket's RocksDB rows in key order: in chunks, from one snapshot, checked for corruption.

Rows are consumed from rocksdict's iterators with ``itertools.islice`` (the Rust iterator is driven
from C, no Python per row) in chunks that the caller decodes with the vectorized row codec, so a
scan of any size holds one chunk in memory at a time. Chunks start small and grow (a ``LIMIT`` or a
narrow range reads little) up to :data:`MAX_CHUNK_ROWS`, and to no more rows than fit in
:func:`flightstore.memory.batch_bytes` at the width of the rows read so far (65,536 rows of a
10,000-column table would be gigabytes).

RocksDB iterators end silently at a block they cannot read (a checksum mismatch, a missing file):
``valid()`` turns false and only ``status()`` says why, and rocksdict's ``values()``/``items()``
never look. So every read here proves it reached the real end before it ends:

* a full scan compares the rows it read with the bucket's maintained row count, taken together
  with the snapshot (the write path updates both in one WriteBatch under the tablet's lock);
* a range scan re-seeks a raw iterator of the same snapshot to the last key it returned and checks
  that the next step ends the range with a clean status;
* prefix reads (:func:`prefix_values`, many prefixes at once) step one raw iterator and check the
  status wherever it stops being valid.

Anything else is a :class:`~flightstore.errors.DataLoss` naming the table and bucket, as is any
RocksDB error raised by a read (:func:`storage_errors`); a short answer is never returned.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rocksdict import ReadOptions

from flightstore import memory
from flightstore.errors import DataLoss

__all__ = ["FIRST_CHUNK_ROWS", "MAX_CHUNK_ROWS", "RangeReader", "data_loss", "is_rocksdb_error", "prefix_values",
           "storage_errors"]

log = logging.getLogger("flightstore.kv")

MAX_CHUNK_ROWS = 65_536
FIRST_CHUNK_ROWS = 1_024
_VALUE = operator.itemgetter(1)


def is_rocksdb_error(exc: BaseException) -> bool:
    """rocksdict raises RocksDB's failures (corruption, I/O errors) as plain ``Exception``."""
    return type(exc) is Exception


def data_loss(where: str, what: str, exc: BaseException | None, directory: str) -> DataLoss:
    """The DataLoss of a failed read; RocksDB's message keeps the file name, not the server path
    (the full message goes to the server log)."""
    detail = f": {exc}" if exc is not None else ""
    log.error("%s: %s%s", where, what, detail)
    return DataLoss(f"{where}: {what}{detail}".replace(directory.rstrip("/") + "/", ""))


@contextmanager
def storage_errors(where: str, what: str, directory: str) -> Iterator[None]:
    """Turn a RocksDB error raised inside the block into DataLoss (other errors pass through)."""
    try:
        yield
    except Exception as exc:
        if not is_rocksdb_error(exc):
            raise
        raise data_loss(where, what, exc, directory) from None


def _next_size(size: int, values: list[bytes]) -> int:
    """The next chunk's rows: four times ``size``, within :data:`MAX_CHUNK_ROWS` and the batch
    bytes at the average width of ``values`` (the chunk just read)."""
    width = memory.value_bytes(values) / max(1, len(values))
    return memory.rows_within(width, min(size * 4, MAX_CHUNK_ROWS))


def prefix_values(snapshot: Any, prefixes: Sequence[bytes], *, where: str, directory: str,
                  held_at_most: Callable[[int], None] | None = None) -> tuple[list[bytes], list[int]]:
    """The values of every key of ``snapshot`` starting with each of ``prefixes`` (prefix order,
    key order within a prefix) and how many each prefix has: ONE raw iterator seeks to each
    prefix and steps while the keys keep it (a range reader per prefix costs a snapshot, two
    iterators and a decode each: most of the time of a lookup of many prefixes of a few rows).

    An iterator that stops being valid must say so with a clean status (DataLoss otherwise), so a
    short answer is never returned. ``held_at_most`` is called with the bytes read so far every
    :data:`FIRST_CHUNK_ROWS` values (it raises to stop a read that would hold too much)."""
    values: list[bytes] = []
    counts: list[int] = []
    held, checked = 0, 0
    with storage_errors(where, "RocksDB read failed", directory):
        iterator = snapshot.iter(ReadOptions())
        for prefix in prefixes:
            before = len(values)
            iterator.seek(prefix)
            while iterator.valid():
                key = iterator.key()
                if not key.startswith(prefix):
                    break
                values.append(iterator.value())
                iterator.next()
            else:
                iterator.status()  # raises RocksDB's error if it stopped on one
            counts.append(len(values) - before)
            if held_at_most is not None and len(values) - checked >= FIRST_CHUNK_ROWS:
                held += memory.value_bytes(values[checked:])
                checked = len(values)
                held_at_most(held)
    if held_at_most is not None and len(values) > checked:
        held_at_most(held + memory.value_bytes(values[checked:]))
    return values, counts


class RangeReader:
    """Values of one snapshot's keys in ``[lower, upper)`` (None: unbounded), in key order.

    ``expected_rows`` (for a read of the whole key space) is the row count that goes with the
    snapshot. ``where`` ("table db.t bucket 3") and ``directory`` shape error messages.
    """

    def __init__(self, snapshot: Any, lower: bytes | None, upper: bytes | None, *, where: str,
                 directory: str, expected_rows: int | None = None) -> None:
        self.snapshot = snapshot
        self.lower = lower
        self.upper = upper
        self.where = where
        self.directory = directory
        self.expected_rows = expected_rows if lower is None and upper is None else None

    def _read_options(self) -> ReadOptions:
        options = ReadOptions()
        if self.upper is not None:
            options.set_iterate_upper_bound(self.upper)
        return options

    def chunks(self, first: int = FIRST_CHUNK_ROWS) -> Iterator[list[bytes]]:
        """Lists of values, growing from ``first`` to :data:`MAX_CHUNK_ROWS` rows, each within
        :func:`flightstore.memory.batch_bytes` (at the width read so far); raises DataLoss at the
        end if RocksDB stopped before the end of the range."""
        if self.lower is not None and self.upper is not None and self.lower >= self.upper:
            return
        size = max(1, min(first, MAX_CHUNK_ROWS))
        with storage_errors(self.where, "RocksDB read failed", self.directory):
            if self.expected_rows is not None:  # the whole key space: values, checked by count
                source = self.snapshot.values(read_opt=self._read_options())
                read = 0
                while True:
                    chunk = list(itertools.islice(source, size))
                    read += len(chunk)
                    if chunk:
                        yield chunk
                    if len(chunk) < size:
                        break
                    size = _next_size(size, chunk)
                if read != self.expected_rows:
                    self._check_walk(f"the scan read {read} of {self.expected_rows} rows")
                return
            items = self.snapshot.items(from_key=self.lower, read_opt=self._read_options())
            last: bytes | None = None
            while True:
                chunk = list(itertools.islice(items, size))
                if chunk:
                    last = chunk[-1][0]
                    values = list(map(_VALUE, chunk))
                    yield values
                if len(chunk) < size:
                    break
                size = _next_size(size, values)
            self._check_end(last)

    def _check_end(self, last: bytes | None) -> None:
        """Prove the iteration ended at the end of the range: a raw iterator of the same snapshot,
        one step past the last key returned, must be invalid with a clean status."""
        iterator = self.snapshot.iter(self._read_options())
        if last is not None:
            iterator.seek(last)
            if iterator.valid():
                iterator.next()
        elif self.lower is not None:
            iterator.seek(self.lower)
        else:
            iterator.seek_to_first()
        try:
            iterator.status()
        except Exception as exc:
            if not is_rocksdb_error(exc):
                raise
            raise data_loss(self.where, "RocksDB read failed", exc, self.directory) from None
        if iterator.valid():
            raise data_loss(self.where, "RocksDB ended a range scan before its end", None,
                            self.directory)

    def _check_walk(self, what: str) -> None:
        """After a full scan disagreed with the row count: walk a raw iterator to the end and
        raise DataLoss with RocksDB's reason if it reports one. A clean walk means the data is
        whole and the maintained count is what is off (logged; the rows read are the answer).
        This runs only when something is already wrong, so its Python loop does not matter."""
        iterator = self.snapshot.iter(self._read_options())
        iterator.seek_to_first()
        while iterator.valid():
            iterator.next()
        try:
            iterator.status()
        except Exception as exc:
            if not is_rocksdb_error(exc):
                raise
            raise data_loss(self.where, what, exc, self.directory) from None
        log.warning("%s: %s, but RocksDB reports no error: the maintained row count is off",
                    self.where, what)
