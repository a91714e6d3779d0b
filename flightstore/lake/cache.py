"""A bounded local cache of decoded lake data files, so a union read of tiered rows costs what a
log read costs: the rows of each Parquet data file, once decoded (the columns a union read asks
for: :func:`flightstore.lake.files.cached_schema`), are kept as an uncompressed Arrow IPC file that
later reads memory-map (zero-copy, no decode).

* Key: the lake table's Iceberg ``table-uuid``, the data file's path, byte size and record count,
  and the schema of the cached rows. Only checked data files are put in the cache (size and
  whole-file CRC, :mod:`flightstore.lake.integrity`, before they are decoded). Iceberg never
  rewrites a data file in place, but a table dropped and created again may reuse a warehouse
  path: it is another lake table (another uuid), so it never reads the rows of the old one's file.
* A file is filled under a temporary name and renamed into place once every row of the data file
  is in it: a fill that dies (kill -9) leaves a temporary file no read ever opens, removed when a
  cache opens the directory again. A read checks the file it opens (Arrow IPC footer, schema, row
  count); one that does not pass (truncated, garbage) is deleted and the data file read from the
  lake again, never served.
* Size: at most ``datalake.read-cache.size`` bytes of cache files (least recently used evicted
  first; 0 disables the cache). A file bigger than the whole cache is not cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa

__all__ = ["CacheFill", "ReadCache"]

_SUFFIX = ".arrow"
_PARTIAL = ".partial"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)
# In every key: files cached before data files were checked before they are decoded
# (flightstore.lake.integrity) are never read again (the cache evicts them in time).
_KEY_VERSION = b"checked-1\0"


class ReadCache:
    """Decoded lake data files under ``directory``, at most ``max_bytes`` of them. Thread-safe;
    one process owns a directory (the server of its data directory)."""

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recently used first
        self._bytes = 0
        self.hits = self.misses = self.rejected = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.directory.iterdir():
            if path.name.endswith(_PARTIAL):  # a fill that died: never complete, never read
                with contextlib.suppress(OSError):
                    path.unlink()
            elif path.name.endswith(_SUFFIX):
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    found.append((stat.st_mtime, path.name[:-len(_SUFFIX)], stat.st_size))
        for _, key, size in sorted(found):
            self._entries[key] = size
            self._bytes += size
        self._evict()

    @staticmethod
    def key(table_uuid: str, file_path: str, file_size: int, record_count: int, schema: pa.Schema) -> str:
        """The cache key of a data file of a lake table, cached with ``schema``."""
        digest = hashlib.sha256(_KEY_VERSION)
        for part in (str(table_uuid), file_path, str(int(file_size)), str(int(record_count))):
            digest.update(part.encode())
            digest.update(b"\0")
        digest.update(schema.remove_metadata().serialize().to_pybytes())
        return digest.hexdigest()[:40]

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    @property
    def disk_bytes(self) -> int:
        """Bytes of the cache files held now."""
        with self._lock:
            return self._bytes

    def read(self, key: str, schema: pa.Schema, rows: int) -> list[pa.RecordBatch] | None:
        """The cached batches of ``key`` (memory-mapped), or None when it is not cached or its file
        does not hold ``rows`` rows of ``schema`` (that file is deleted)."""
        path = self.path(key)
        try:
            source = pa.memory_map(str(path))
        except FileNotFoundError:
            self._forget(key)
            with self._lock:
                self.misses += 1
            return None
        try:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            for batch in batches:
                batch.validate()  # buffers as long as the arrays say (cheap: not the values)
            valid = reader.schema.equals(schema) and sum(b.num_rows for b in batches) == rows
        except (pa.ArrowException, OSError):
            valid = False
        if not valid:
            self._reject(key)
            return None
        with self._lock:
            self.hits += 1
            untracked = key not in self._entries  # put there by another cache object of the directory
            self._bytes -= self._entries.pop(key, 0)
            self._entries[key] = source.size()
            self._bytes += self._entries[key]
        with contextlib.suppress(OSError):
            os.utime(path)  # the recency a restarted server orders entries by
        if untracked:
            self._evict()
        return batches

    def fill(self, key: str, schema: pa.Schema, rows: int) -> CacheFill:
        """A writer of the batches of ``key`` (``rows`` rows of ``schema`` in all)."""
        return CacheFill(self, key, schema, rows)

    def clear(self) -> None:
        """Delete every cache file."""
        with self._lock:
            keys = list(self._entries)
        for key in keys:
            self._forget(key, unlink=True)

    # ---- internals ----------------------------------------------------------------------------
    def _reject(self, key: str) -> None:
        with self._lock:
            self.rejected += 1
            self.misses += 1
        self._forget(key, unlink=True)

    def _forget(self, key: str, unlink: bool = False) -> None:
        with self._lock:
            size = self._entries.pop(key, None)
            if size is not None:
                self._bytes -= size
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()

    def _admit(self, key: str, partial: Path, size: int) -> None:
        if size > self.max_bytes:
            partial.unlink(missing_ok=True)
            return
        os.replace(partial, self.path(key))
        with self._lock:
            self._bytes -= self._entries.pop(key, 0)
            self._entries[key] = size
            self._bytes += size
        self._evict()

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self._bytes <= self.max_bytes or not self._entries:
                    return
                key, size = self._entries.popitem(last=False)
                self._bytes -= size
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()  # readers that mapped it keep their mapping


class CacheFill:
    """Writes one data file's decoded batches; :meth:`commit` puts the file in place once all of
    its rows are written, :meth:`abort` (or any failure) leaves nothing."""

    def __init__(self, cache: ReadCache, key: str, schema: pa.Schema, rows: int) -> None:
        self.cache, self.key, self.schema, self.rows = cache, key, schema, rows
        self.written = 0
        self._partial = cache.directory / f"{key}.{os.getpid()}-{uuid.uuid4().hex[:8]}{_PARTIAL}"
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer = pa.ipc.new_file(self._sink, schema, options=_IPC_OPTIONS)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.written += batch.num_rows

    def commit(self) -> bool:
        """Close and admit the file when it holds every row (else drop it); True when admitted."""
        try:
            self._writer.close()
            size = self._sink.tell()
            self._sink.close()
        except (pa.ArrowException, OSError):
            self.abort()
            return False
        if self.written != self.rows:
            self.abort()
            return False
        try:
            self.cache._admit(self.key, self._partial, size)
        except OSError:
            self.abort()
            return False
        return True

    def abort(self) -> None:
        with contextlib.suppress(pa.ArrowException, OSError):
            self._writer.close()
        with contextlib.suppress(pa.ArrowException, OSError):
            self._sink.close()
        self._partial.unlink(missing_ok=True)
