"""Reading one segment's payloads, checked: every decoded byte is verified before it is answered.

An uncompressed payload is decoded in place from a memory map of the segment against the log's
schema (zero-copy; only the requested columns' buffers are paged in), and the decoded record is kept
(:data:`DECODED_RECORDS_PER_SEGMENT` per segment) with the columns already verified, so a repeated
scan neither parses nor checks it again. A compressed payload is read through a counting positional
file that fetches only the requested columns' buffers, and decompressed.

What is checked: a read of every column checks the payload's CRC (one call over the whole payload:
metadata and every buffer); a read of some columns checks their structure and their column
checksums (:func:`flightstore.log.record.column_checksums`), and a compressed payload's embedded
schema. Any failure is :class:`~flightstore.errors.DataLoss` naming the log, the offsets and the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from flightstore.errors import DataLoss
from flightstore.log.record import RecordHeader, _array_checksum, decode_payload

__all__ = ["DECODED_RECORDS_PER_SEGMENT", "PayloadReader"]

DECODED_RECORDS_PER_SEGMENT = 4096


class PayloadReader:
    """The payload reads of one segment file; safe to use from concurrent readers."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self._reader: pa.NativeFile | None = None
        self._map: pa.Buffer | None = None
        # Decoded uncompressed records (zero-copy views of the map) by payload position, with the
        # columns whose checksum was verified: records never change, repeated scans skip both.
        self._decoded: dict[int, tuple[pa.Schema, pa.RecordBatch, set[int]]] = {}

    def read_batch(self, record: RecordHeader, included_fields: Sequence[int] | None,
                   schema: pa.Schema, compressed: bool = False) -> tuple[pa.RecordBatch, int]:
        """Decode ``record``'s payload, only the fields at ``included_fields`` (None: all) of the
        log's ``schema``, each checked (structure and checksum): corrupt bytes raise
        :class:`DataLoss`. Returns the batch and the bytes read from the file."""
        if not compressed:
            # Uncompressed: the record batch is decoded in place against the known schema, and only
            # the requested columns' buffers are kept (and paged in when used): they are the bytes read.
            batch, verified = self._read_mapped(record, schema)
            if included_fields is None:  # every column: one CRC of the whole payload is cheaper
                if len(verified) < batch.num_columns:
                    self._verify_payload(record)
                    verified.update(range(batch.num_columns))
                return batch, record.payload_len
            self._verify(record, batch.num_rows,
                         ((f, batch.column(f)) for f in included_fields if f not in verified),
                         verified)
            batch = batch.select(list(included_fields))
            return batch, batch.nbytes  # the selected columns' buffers: what gets paged in
        fields = list(range(len(schema)) if included_fields is None else included_fields)
        if included_fields is None:
            self._verify_payload(record)
            batch, nbytes = self._decode_file(record, pa.BufferReader(self._mapped(record)),
                                              None), record.payload_len
        else:
            if self._reader is None:
                self._reader = pa.OSFile(str(self.path), "r")
            counting = _CountingFile(self._reader, record.payload_position, record.payload_len)
            batch = self._decode_file(record, pa.PythonFile(counting, mode="r"), fields)
            nbytes = counting.bytes_read
        # The payload carries its own schema (a compressed record is decoded from it): it must be
        # the log's, else the bytes that hold it are corrupt.
        want = [(schema[f].name, schema[f].type) for f in fields]
        try:
            got = [(field.name, field.type) for field in batch.schema]
        except ValueError:  # a field name that is not UTF-8
            got = None
        if got != want:
            raise self._loss(record, "its embedded schema is not the log's")
        self._verify(record, batch.num_rows, zip(fields, batch.columns), None)
        return batch, nbytes

    def _decode_file(self, record: RecordHeader, source: Any,
                     included_fields: list[int] | None) -> pa.RecordBatch:
        """The batch of a payload read as an IPC file (compressed records)."""
        options = pa.ipc.IpcReadOptions(included_fields=included_fields)
        try:
            return pa.ipc.open_file(source, options=options).get_batch(0)
        except (pa.ArrowException, OSError, ValueError, KeyError, IndexError) as exc:
            raise self._loss(record, f"it cannot be decoded: {exc}") from None

    def _verify_payload(self, record: RecordHeader) -> None:
        """A whole-payload read checks the payload CRC (metadata and every buffer)."""
        if zlib.crc32(self._mapped(record)) != record.payload_crc:
            raise self._loss(record, "its payload fails its CRC")

    def _verify(self, record: RecordHeader, num_rows: int, columns: Iterable[tuple[int, Any]],
                verified: set[int] | None) -> None:
        """Check decoded columns: their structure (what the IPC metadata gave them) and their
        checksums. ``verified`` remembers the columns of a cached batch already checked. Version 1
        records have no checksums (``flightstore verify`` checks their payload CRC)."""
        if num_rows != record.num_rows:
            raise self._loss(record, f"it decodes to {num_rows} rows, its header says "
                                     f"{record.num_rows}")
        for field, column in columns:
            if verified is not None and field in verified:
                continue
            try:
                column.validate()
            except pa.ArrowInvalid as exc:
                raise self._loss(record, f"column {field} decodes to an invalid array: {exc}") from None
            if record.checksums and (field >= len(record.checksums)
                                     or _array_checksum(column) != record.checksums[field]):
                raise self._loss(record, f"column {field} fails its checksum")
            if verified is not None:
                verified.add(field)

    def _loss(self, record: RecordHeader, why: str) -> DataLoss:
        return DataLoss(f"{self.label}: log offsets {record.base_offset}..{record.next_offset - 1} "
                        f"are unreadable: the record at byte {record.position} of {self.path.name} is "
                        f"corrupt ({why}); run `flightstore verify` and `flightstore repair`")

    def raw(self, record: RecordHeader) -> pa.Buffer:
        """The record's payload bytes as stored, unchecked (replication checks the CRC on arrival).

        A record past the end of the current memory map (the active segment grew since it was
        mapped: a leader reads each record it just appended, for its followers) is read with one
        positioned read instead: mapping the whole segment again for every new record (and
        unmapping the old map) cost about ten times as much CPU (230 against 25 us per record
        on a 30 MB active segment)."""
        mapped = self._map
        if mapped is not None and mapped.size >= record.payload_position + record.payload_len:
            return mapped.slice(record.payload_position, record.payload_len)
        reader = self._reader
        if reader is None:
            reader = self._reader = pa.OSFile(str(self.path), "r")
        data = reader.read_at(record.payload_len, record.payload_position)
        if len(data) < record.payload_len:
            raise self._loss(record, "the file is shorter than the record")
        return pa.py_buffer(data)

    def _mapped(self, record: RecordHeader) -> pa.Buffer:
        """The record's payload as a slice of a memory map of the segment."""
        end = record.payload_position + record.payload_len
        mapped = self._map
        if mapped is None or mapped.size < end:
            with pa.memory_map(str(self.path), "r") as source:
                mapped = source.read_buffer(source.size())  # keeps the mapping alive
            self._map = mapped
        if mapped.size < end:
            raise self._loss(record, "the file is shorter than the record")
        return mapped.slice(record.payload_position, record.payload_len)

    def _read_mapped(self, record: RecordHeader, schema: pa.Schema) -> tuple[pa.RecordBatch, set]:
        """Every column of an uncompressed ``record`` as zero-copy views of the memory map.

        The payload is an IPC file: 8 bytes of magic, then the schema message and the record batch
        message of the stream format. Decoding the batch message against the tablet's schema skips
        parsing the file footer and the schema for every record.
        """
        cached = self._decoded.get(record.payload_position)
        if cached is not None and cached[0] is schema:
            return cached[1], cached[2]
        try:
            batch = decode_payload(self._mapped(record), schema)
        except (pa.ArrowException, OSError, ValueError, KeyError, IndexError, StopIteration) as exc:
            raise self._loss(record, f"it cannot be decoded: {exc}") from None
        if len(self._decoded) >= DECODED_RECORDS_PER_SEGMENT:
            try:  # the oldest entry; a concurrent reader may be changing the dict
                self._decoded.pop(next(iter(self._decoded)), None)
            except (RuntimeError, StopIteration):
                pass
        verified: set[int] = set()
        self._decoded[record.payload_position] = (schema, batch, verified)
        return batch, verified

    def open_now(self) -> None:
        """Map the file (and open it for compressed reads) now, so reads go on after it is
        unlinked (a released segment)."""
        if self._map is None:
            with pa.memory_map(str(self.path), "r") as source:
                self._map = source.read_buffer(source.size())
        if self._reader is None:
            self._reader = pa.OSFile(str(self.path), "r")

    def close(self) -> None:
        """Drop the map and the decoded records (batches already read keep their mapping alive)."""
        self._map = None
        self._decoded = {}
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class _CountingFile:
    """A read-only, seekable file over one payload that counts the bytes handed to Arrow."""

    def __init__(self, source: pa.NativeFile, position: int, size: int) -> None:
        self._source, self._base, self._size = source, position, size
        self._pos = 0
        self.bytes_read = 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1
                                                else self._size + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, nbytes: int = -1) -> pa.Buffer:
        nbytes = self._size - self._pos if nbytes is None or nbytes < 0 else min(
            nbytes, self._size - self._pos)
        data = self._source.read_at(nbytes, self._base + self._pos)
        self._pos += nbytes
        self.bytes_read += nbytes
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
