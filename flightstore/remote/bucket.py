"""One bucket in remote storage: its manifests, the reads its log makes through it, its expiry.

A :class:`RemoteBucket` is attached to the bucket's :class:`~flightstore.log.tablet.LogTablet`
(:meth:`~flightstore.log.tablet.LogTablet.attach_remote`), which asks it for what lies below its
local segments: the log's start offset, the remote segments to read, a timestamp's offset, the
declared lost rows and the writers' state of segments no longer local. The manifests are read
from storage once, when first needed, and then kept in memory; this server is their only writer
(uploads: :mod:`flightstore.remote.uploader`; expiry: :meth:`RemoteBucket.expire`).

Offsets a read needs from remote storage while it cannot be reached are
:class:`~flightstore.errors.RemoteStorageUnavailable`, never a shorter answer. A log whose local
segments start at 0 needs nothing from remote storage and never asks it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flightstore.errors import CorruptData, DataLoss, RemoteStorageUnavailable
from flightstore.log.segment import Segment
from flightstore.remote.manifest import KvManifest, LogManifest, SegmentEntry, VersionedManifest
from flightstore.remote.reader import RemoteSegment
from flightstore.remote.storage import RemoteStorage, RemoteTable

__all__ = ["MARKER", "RemoteBucket", "read_marker", "write_marker"]

MARKER = "remote.json"  # in the bucket's local directory: {"log": version, "kv": version}

log = logging.getLogger("flightstore.remote")


class RemoteBucket:
    """Bucket ``bucket`` of ``table`` in remote storage; ``label`` names it in errors."""

    def __init__(self, table: RemoteTable, bucket: int, label: str, local: Path | None = None) -> None:
        """``local``: the bucket's local directory, where the manifest versions this server
        wrote are recorded (:data:`MARKER`), so that remote storage answering with less than that
        (another ``remote.data.dir``, or its data lost) is DataLoss, never an empty history."""
        self.table = table
        self.storage: RemoteStorage = table.storage
        self.bucket = bucket
        self.label = label
        self.marker = None if local is None else Path(local) / MARKER
        self._lock = threading.Lock()
        # Held by whoever changes the manifests (uploads, local deletion, expiry), for the whole
        # read-modify-write: two threads of this server never commit from the same old version.
        self.writing = threading.RLock()
        self._path: str | None = None
        self._log: LogManifest | None = None
        self._kv: KvManifest | None = None
        self._log_versions: VersionedManifest | None = None
        self._kv_versions: VersionedManifest | None = None

    @property
    def path(self) -> str:
        """The bucket's directory in remote storage."""
        if self._path is None:
            self._path = self.table.bucket_path(self.bucket)
        return self._path

    def __repr__(self) -> str:
        return f"RemoteBucket({self.storage.uri_of(self.path)!r})"

    # ---- manifests ----------------------------------------------------------------------------
    def log_manifest(self) -> LogManifest:
        """The uploaded segments (read from storage on first use)."""
        manifest = self._log
        if manifest is None:
            with self._lock:
                if self._log is None:
                    versions = self._log_versions = VersionedManifest(
                        self.storage, f"{self.path}/log", self.label)
                    loaded = versions.load()
                    self._check_marker("log", 0 if loaded is None else loaded[0])
                    self._log = LogManifest() if loaded is None else LogManifest.from_body(*loaded)
                manifest = self._log
        return manifest

    def kv_manifest(self) -> KvManifest:
        """The uploaded KV snapshots (read from storage on first use)."""
        manifest = self._kv
        if manifest is None:
            with self._lock:
                if self._kv is None:
                    versions = self._kv_versions = VersionedManifest(
                        self.storage, f"{self.path}/kv", self.label)
                    loaded = versions.load()
                    self._check_marker("kv", 0 if loaded is None else loaded[0])
                    self._kv = KvManifest() if loaded is None else KvManifest.from_body(*loaded)
                manifest = self._kv
        return manifest

    def commit_log(self, manifest: LogManifest) -> LogManifest:
        """Make ``manifest`` the bucket's log manifest (durable in storage first)."""
        self.log_manifest()
        version = self._log_versions.commit(manifest.body(), manifest.version)
        with self._lock:
            self._log = LogManifest(version, manifest.segments, manifest.schema_epochs)
        self._write_marker()
        return self._log

    def commit_kv(self, manifest: KvManifest) -> KvManifest:
        """Make ``manifest`` the bucket's KV manifest (durable in storage first)."""
        self.kv_manifest()
        version = self._kv_versions.commit(manifest.body(), manifest.version)
        with self._lock:
            self._kv = KvManifest(version, manifest.snapshots)
        self._write_marker()
        return self._kv

    def _check_marker(self, which: str, loaded: int) -> None:
        written = read_marker(self.marker).get(which, 0) if self.marker is not None else 0
        if loaded < written:
            where = self.storage.uri_of(f"{self.path}/{which}")
            held = "no manifest" if loaded == 0 else f"manifest version {loaded}"
            raise DataLoss(f"{self.label}: remote storage holds {held} at {where}, but this bucket "
                           f"wrote version {written} there: 'remote.data.dir' is not where it "
                           "uploaded to, or that remote data was lost; the offsets only it held "
                           "cannot be read")

    def _write_marker(self) -> None:
        if self.marker is not None:
            versions = {"log": self._log.version if self._log is not None else 0,
                        "kv": self._kv.version if self._kv is not None else 0}
            previous = read_marker(self.marker)
            write_marker(self.marker, {k: max(v, previous.get(k, 0)) for k, v in versions.items()})

    def refresh(self) -> None:
        """Forget the manifests read so far: the next use reads them from storage again (for a
        server that takes over uploading a bucket another one uploaded meanwhile)."""
        with self.writing, self._lock:
            self._log = self._kv = None

    def stored(self) -> bool:
        """Whether remote storage holds anything of this bucket (segments or snapshots)."""
        return bool(self.log_manifest().segments or self.kv_manifest().snapshots)

    # ---- what the log asks --------------------------------------------------------------------
    def start_offset(self, local_start: int) -> int:
        """The first offset the bucket holds: the start of the uploaded segments that continue
        the local ones downwards (``local_start`` when there are none)."""
        if local_start == 0:
            return 0
        chain = self.log_manifest().chain(local_start)
        return chain[0].base_offset if chain else local_start

    def segments_below(self, local_start: int) -> list[RemoteSegment]:
        """The uploaded segments below ``local_start``, as segments the log's reader reads
        (downloaded when the read reaches them)."""
        if local_start == 0:
            return []
        return [RemoteSegment(e.base_offset, e.next_offset, self._opener(e))
                for e in self.log_manifest().chain(local_start)]

    def lost_rows(self, local_start: int) -> int:
        """Offsets declared lost (``flightstore repair``) in the uploaded segments below
        ``local_start``."""
        if local_start == 0:
            return 0
        return sum(e.lost_rows for e in self.log_manifest().chain(local_start))

    def offset_for_timestamp(self, timestamp_ms: int, local_start: int) -> int | None:
        """The first offset of the first record at or after ``timestamp_ms`` among the uploaded
        segments below ``local_start`` (None: the local segments answer)."""
        if local_start == 0:
            return None
        for entry in self.log_manifest().chain(local_start):
            if entry.max_timestamp_ms is None or entry.max_timestamp_ms < timestamp_ms:
                continue
            segment = RemoteSegment(entry.base_offset, entry.next_offset, self._opener(entry))
            index = segment.view()
            number = index.record_for_timestamp(timestamp_ms)
            if number < len(index):
                return index.bases[number]
        return None

    def writer_activity(self, local_start: int) -> dict[str, tuple[int, int]]:
        """``{writer: (last sequence, newest time of its segment)}`` over the uploaded segments
        below ``local_start`` (the newest wins), so a retried write stays a duplicate after its
        segment left local disk."""
        activity: dict[str, tuple[int, int]] = {}
        if local_start == 0:
            return activity
        try:
            chain = self.log_manifest().chain(local_start)
        except (RemoteStorageUnavailable, DataLoss) as exc:
            # Opening goes on: a writer known only there is refused a retry (its state is
            # unknown), never applied twice; reads of those offsets fail the same way meanwhile.
            log.error("%s: the writer state of the uploaded segments is unknown: %s", self.label, exc)
            return activity
        for entry in chain:
            activity.update({w: (seq, entry.max_timestamp_ms or 0) for w, seq in entry.writers.items()})
        return activity

    def _opener(self, entry: SegmentEntry) -> Callable[[], tuple[Segment, Callable[[], None]]]:
        return lambda: self.open_segment(entry)

    def open_segment(self, entry: SegmentEntry) -> tuple[Segment, Callable[[], None]]:
        """``entry``'s segment from the cache (downloaded and checked first when absent), and the
        function that releases it. DataLoss naming it when storage lost it or it fails its
        checksum."""
        folder = f"{self.path}/{entry.folder}"
        where = (f"remote log segment {self.storage.uri_of(folder)} (offsets {entry.base_offset}.."
                 f"{entry.next_offset - 1})")

        def download(into) -> None:
            for file in entry.files:
                self.storage.get_file(f"{folder}/{file.name}", into / file.name, file,
                                      f"{self.label}: {where}")

        def open_segment(into) -> Segment:
            segment = Segment.open_sealed(into, entry.base_offset, self.label)
            if segment.next_offset != entry.next_offset:
                raise DataLoss(f"{self.label}: {where} holds offsets up to {segment.next_offset - 1}, "
                               f"its manifest says {entry.next_offset - 1}")
            return segment

        try:
            return self.storage.cache.acquire(folder, download, open_segment)
        except FileNotFoundError as exc:
            if entry not in self.log_manifest().segments:  # expired while the read went on
                raise CorruptData(f"{self.label}: {where} was deleted while being read (retention)") \
                    from None
            raise DataLoss(f"{self.label}: {where} is missing from remote storage ({exc}); the answer "
                           "would be incomplete") from None

    # ---- expiry -------------------------------------------------------------------------------
    def expire(self, now_ms: int | None, ttl_ms: int | None, floor: int | None) -> int:
        """Delete the oldest uploaded segments whose newest record is older than ``ttl_ms``,
        never one holding an offset at or above ``floor`` (what the local retention keeps: the
        oldest local KV snapshot, the lake's tiered offset) nor, on a primary-key table, at or
        above the oldest uploaded KV snapshot (a rebuild starts there). The manifest without them
        is written before their files are deleted. Returns the number deleted."""
        if ttl_ms is None:
            return 0
        with self.writing:
            return self._expire(now_ms, ttl_ms, floor)

    def _expire(self, now_ms: int | None, ttl_ms: int, floor: int | None) -> int:
        manifest = self.log_manifest()
        if not manifest.segments:
            return 0
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        limits = [] if floor is None else [floor]
        if self.table.has_primary_key:
            limits.append(self.kv_manifest().oldest_offset or 0)
        limit = min(limits) if limits else None
        doomed: list[SegmentEntry] = []
        for entry in manifest.segments:
            if entry.max_timestamp_ms is not None and entry.max_timestamp_ms >= now - ttl_ms:
                break
            if limit is not None and entry.next_offset > limit:
                break
            doomed.append(entry)
        if not doomed:
            return 0
        self.commit_log(manifest.without(doomed))
        for entry in doomed:
            self.storage.delete_dir(f"{self.path}/{entry.folder}")
        log.info("%s: deleted %d expired remote log segment(s), offsets %d..%d", self.label,
                 len(doomed), doomed[0].base_offset, doomed[-1].next_offset - 1)
        return len(doomed)


def read_marker(path: Path) -> dict[str, int]:
    """The manifest versions recorded in ``path`` (none when it does not exist)."""
    try:
        data = json.loads(path.read_text())
        return {str(k): int(v) for k, v in data.items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptData(f"{path}: unreadable ({exc})") from None


def write_marker(path: Path, versions: dict[str, int]) -> None:
    """Record ``versions`` in ``path`` atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(versions, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
