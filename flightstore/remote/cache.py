"""The bounded local cache of remote log segments: downloaded once, read with the segment reader.

A read of offsets below a bucket's local segments downloads each remote segment it reaches (its
files checked against the manifest's checksums) into ``DATA_DIR/remote-cache/<key>/`` and opens it
as a sealed :class:`~flightstore.log.segment.Segment`, so column pruning, statistics skipping and
the record CRC checks work as on local segments. Entries are shared by concurrent readers; an entry
is *pinned* while a reader holds it and is never evicted then. When the cache holds more than its
capacity, the least recently used unpinned entries are deleted (a single segment larger than the
capacity is still read: it goes as soon as its reader lets go). The directory is emptied when the
cache is created: its contents are only ever a copy.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from flightstore.log.segment import LOADED, Segment

__all__ = ["SegmentCache"]


class _Entry:
    __slots__ = ("folder", "lock", "pins", "segment", "size")

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.Lock()  # one download at a time
        self.pins = 0
        self.segment: Segment | None = None
        self.size = 0


class SegmentCache:
    """Downloaded remote segments under ``directory``, at most about ``capacity`` bytes."""

    def __init__(self, directory: Path, capacity: int) -> None:
        self.directory = Path(directory)
        self.capacity = int(capacity)
        shutil.rmtree(self.directory, ignore_errors=True)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self.downloads = 0

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes

    def acquire(self, key: str, download: Callable[[Path], None],
                open_segment: Callable[[Path], Segment]) -> tuple[Segment, Callable[[], None]]:
        """The segment cached under ``key`` (a remote folder's full path), downloaded first when
        absent: ``download(folder)`` fills an empty folder, ``open_segment(folder)`` opens it.
        Returns the segment and the function that unpins it (call it once, when done)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                name = hashlib.sha256(key.encode()).hexdigest()[:32]
                entry = self._entries[key] = _Entry(self.directory / name)
            entry.pins += 1
            self._entries.move_to_end(key)
        try:
            with entry.lock:
                if entry.segment is None:
                    self._fill(entry, download, open_segment)
        except BaseException:
            self._unpin(key, entry)
            raise
        self._evict()
        released = threading.Event()

        def release() -> None:
            if not released.is_set():
                released.set()
                self._unpin(key, entry)
        return entry.segment, release

    def _fill(self, entry: _Entry, download: Callable[[Path], None],
              open_segment: Callable[[Path], Segment]) -> None:
        staging = entry.folder.with_name(entry.folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(entry.folder, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            download(staging)
            staging.rename(entry.folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            segment = open_segment(entry.folder)
        except BaseException:
            shutil.rmtree(entry.folder, ignore_errors=True)
            raise
        size = sum(p.stat().st_size for p in entry.folder.rglob("*") if p.is_file())
        with self._lock:
            entry.segment, entry.size = segment, size
            self._bytes += size
            self.downloads += 1

    def _unpin(self, key: str, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.pins == 0 and entry.segment is None and self._entries.get(key) is entry:
                del self._entries[key]  # its download failed: nothing to keep
        self._evict()

    def _evict(self) -> None:
        doomed: list[_Entry] = []
        with self._lock:
            if self._bytes <= self.capacity:
                return
            for key, entry in list(self._entries.items()):  # least recently used first
                if self._bytes <= self.capacity:
                    break
                if entry.pins == 0 and entry.segment is not None:
                    del self._entries[key]
                    self._bytes -= entry.size
                    doomed.append(entry)
        for entry in doomed:
            LOADED.forget(entry.segment)
            entry.segment.close()
            shutil.rmtree(entry.folder, ignore_errors=True)

    def clear(self) -> None:
        """Delete every unpinned entry (a stopping server; tests)."""
        capacity, self.capacity = self.capacity, 0
        try:
            self._evict()
        finally:
            self.capacity = capacity
