"""Manifests of a bucket in remote storage: which uploaded files make its log and its KV snapshots.

A manifest is replaced atomically without a rename (object stores have none): each change writes a
new file ``<dir>/manifest/<version>.json`` (20-digit version, one more than any version seen) and
readers take the newest one that is *complete*. A file holds the manifest's JSON, a newline and the
SHA-256 of that JSON: a file cut short by a crash (a local file system writes in place) or damaged
fails the check and is skipped, so the previous version is read; an object store makes a file
visible only once it is whole. The newest :data:`KEEP_VERSIONS` versions are kept, older ones are
deleted after a new one is written. Nothing a manifest references is deleted before a manifest
that no longer references it is written.

The **log manifest** lists the uploaded segments in offset order (base and next offset, records,
bytes, newest timestamp, declared lost rows, writers' last sequences, and the folder and files with
their sizes and checksums) and the log's schema epochs (which schema version wrote which offsets).
The **KV manifest** lists the uploaded KV snapshots in upload order (id, log offset, rows, creation
time, folder and files).

One writer per bucket (the server that holds it; in a cluster, its leader). Two writers at once
could write the same version twice: the last one wins and the other's upload is orphaned (never
half-read).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from flightstore.remote.storage import RemoteFile, RemoteStorage

__all__ = ["KEEP_VERSIONS", "KvManifest", "LogManifest", "SegmentEntry", "SnapshotEntry",
           "VersionedManifest"]

log = logging.getLogger("flightstore.remote")

FORMAT = 1
KEEP_VERSIONS = 3
_SUFFIX = ".json"


class VersionedManifest:
    """The versions of one manifest in remote storage (``<directory>/manifest/``)."""

    def __init__(self, storage: RemoteStorage, directory: str, label: str) -> None:
        self.storage = storage
        self.directory = f"{directory}/manifest"
        self.label = label
        self.highest_seen = 0  # the highest version listed, complete or not: the next one is above
        self._listed: list[int] = []  # versions listed by load(), pruned by the next commit

    def load(self) -> tuple[int, dict] | None:
        """The newest complete version and its body (None when no version is complete)."""
        versions = sorted((int(name[:-len(_SUFFIX)]) for name in self.storage.list_dir(self.directory)
                           if name.endswith(_SUFFIX) and name[:-len(_SUFFIX)].isdigit()), reverse=True)
        if versions:
            self.highest_seen = max(self.highest_seen, versions[0])
        self._listed = versions
        for version in versions:
            path = self._path(version)
            try:
                body = _decode(self.storage.get_bytes(path))
            except FileNotFoundError:  # deleted since listed (a newer one replaced it)
                continue
            except ValueError as exc:
                log.warning("%s: remote manifest %s is incomplete or damaged (%s); reading the "
                            "version before it", self.label, self.storage.uri_of(path), exc)
                continue
            if body.get("version") != version or body.get("format") != FORMAT:
                log.warning("%s: remote manifest %s does not describe version %d; skipping it",
                            self.label, self.storage.uri_of(path), version)
                continue
            return version, body
        return None

    def commit(self, body: dict, loaded: int) -> int:
        """Write ``body`` as the next version (above ``loaded`` and every version seen), then
        delete versions older than the newest :data:`KEEP_VERSIONS`; returns the new version."""
        version = max(loaded, self.highest_seen) + 1
        body = {**body, "format": FORMAT, "version": version}
        self.storage.put_bytes(_encode(body), self._path(version))
        previous, self.highest_seen = self.highest_seen, version
        doomed = set(range(max(previous - KEEP_VERSIONS + 1, 1), version - KEEP_VERSIONS + 1))
        doomed.update(v for v in self._listed if v <= version - KEEP_VERSIONS)
        self._listed = []
        for old in sorted(doomed):
            self.storage.delete_file(self._path(old))  # (a missing one is fine)
        return version

    def _path(self, version: int) -> str:
        return f"{self.directory}/{version:020d}{_SUFFIX}"


def _encode(body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return data + b"\n" + hashlib.sha256(data).hexdigest().encode() + b"\n"


def _decode(raw: bytes) -> dict:
    data, _, digest = raw.rstrip(b"\n").rpartition(b"\n")
    if not data or hashlib.sha256(data).hexdigest().encode() != digest:
        raise ValueError("its checksum does not match")
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


# ---- the log manifest -------------------------------------------------------------------------

@dataclass(frozen=True)
class SegmentEntry:
    """One uploaded segment: offsets ``[base_offset, next_offset)`` in ``folder``."""

    base_offset: int
    next_offset: int
    records: int
    size: int  # bytes of the segment file
    max_timestamp_ms: int | None
    lost_rows: int
    writers: dict[str, int]
    folder: str  # relative to the bucket's directory
    files: tuple[RemoteFile, ...]

    def to_json(self) -> dict:
        return {"base": self.base_offset, "next": self.next_offset, "records": self.records,
                "size": self.size, "max_ts": self.max_timestamp_ms, "lost_rows": self.lost_rows,
                "writers": self.writers, "folder": self.folder,
                "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, data: dict) -> SegmentEntry:
        return cls(int(data["base"]), int(data["next"]), int(data["records"]), int(data["size"]),
                   None if data["max_ts"] is None else int(data["max_ts"]), int(data["lost_rows"]),
                   {str(k): int(v) for k, v in data["writers"].items()}, str(data["folder"]),
                   tuple(RemoteFile.from_json(f) for f in data["files"]))

    def matches(self, base_offset: int, next_offset: int, size: int) -> bool:
        """Whether this entry is the upload of the local segment with these offsets and size."""
        return (self.base_offset, self.next_offset, self.size) == (base_offset, next_offset, size)


@dataclass(frozen=True)
class LogManifest:
    """The uploaded segments of one bucket's log, in offset order (version 0: none yet)."""

    version: int = 0
    segments: tuple[SegmentEntry, ...] = ()
    schema_epochs: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def from_body(cls, version: int, body: dict) -> LogManifest:
        epochs = body.get("schema_epochs")
        return cls(version, tuple(SegmentEntry.from_json(s) for s in body["segments"]),
                   None if epochs is None else tuple((int(v), int(o)) for v, o in epochs))

    def body(self) -> dict:
        return {"segments": [s.to_json() for s in self.segments],
                "schema_epochs": None if self.schema_epochs is None else
                [list(e) for e in self.schema_epochs]}

    @property
    def end_offset(self) -> int | None:
        """The offset after the newest uploaded segment (None when nothing is uploaded)."""
        return self.segments[-1].next_offset if self.segments else None

    def holds(self, base_offset: int, next_offset: int, size: int) -> bool:
        return any(s.matches(base_offset, next_offset, size) for s in self.segments)

    def chain(self, local_start: int) -> tuple[SegmentEntry, ...]:
        """The uploaded segments that continue the local log downwards without a gap: the one
        ending at ``local_start``, the one ending where that one starts, and so on. Segments
        below a gap were left behind by retention (expired); reads never reach them."""
        chain: list[SegmentEntry] = []
        position = local_start
        for entry in reversed(self.segments):
            if entry.base_offset >= position:
                continue
            if entry.next_offset != position:
                break
            chain.append(entry)
            position = entry.base_offset
        return tuple(reversed(chain))

    def with_segment(self, entry: SegmentEntry, epochs: Sequence[tuple[int, int]] | None) -> LogManifest:
        segments = tuple(sorted(self.segments + (entry,), key=lambda s: s.base_offset))
        return replace(self, segments=segments,
                       schema_epochs=self.schema_epochs if epochs is None else tuple(map(tuple, epochs)))

    def without(self, doomed: Sequence[SegmentEntry]) -> LogManifest:
        return replace(self, segments=tuple(s for s in self.segments if s not in doomed))


# ---- the KV manifest --------------------------------------------------------------------------

@dataclass(frozen=True)
class SnapshotEntry:
    """One uploaded KV snapshot (its local ``id`` and the log ``offset`` it covers)."""

    id: int
    offset: int
    rows: int
    created_ms: int
    folder: str
    files: tuple[RemoteFile, ...] = field(default=())

    def to_json(self) -> dict:
        return {"id": self.id, "offset": self.offset, "rows": self.rows,
                "created_ms": self.created_ms, "folder": self.folder,
                "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, data: dict) -> SnapshotEntry:
        return cls(int(data["id"]), int(data["offset"]), int(data["rows"]), int(data["created_ms"]),
                   str(data["folder"]), tuple(RemoteFile.from_json(f) for f in data["files"]))


@dataclass(frozen=True)
class KvManifest:
    """The uploaded KV snapshots of one bucket, in upload order (version 0: none yet)."""

    version: int = 0
    snapshots: tuple[SnapshotEntry, ...] = ()

    @classmethod
    def from_body(cls, version: int, body: dict) -> KvManifest:
        return cls(version, tuple(SnapshotEntry.from_json(s) for s in body["snapshots"]))

    def body(self) -> dict:
        return {"snapshots": [s.to_json() for s in self.snapshots]}

    @property
    def newest(self) -> SnapshotEntry | None:
        """The snapshot of the highest offset (the latest uploaded among equals)."""
        return max(reversed(self.snapshots), key=lambda s: s.offset) if self.snapshots else None

    @property
    def oldest_offset(self) -> int | None:
        """The lowest offset a retained snapshot covers: the remote log must keep what follows."""
        return min(s.offset for s in self.snapshots) if self.snapshots else None

    def holds(self, snapshot_id: int, offset: int, created_ms: int) -> bool:
        return any((s.id, s.offset, s.created_ms) == (snapshot_id, offset, created_ms)
                   for s in self.snapshots)

    def with_snapshot(self, entry: SnapshotEntry, retained: int) -> tuple[KvManifest, list[SnapshotEntry]]:
        """This manifest plus ``entry``, keeping the ``retained`` snapshots of the highest offsets;
        returns it and the snapshots it drops."""
        ordered = sorted(self.snapshots + (entry,), key=lambda s: s.offset)
        kept, dropped = ordered[-retained:], ordered[:-retained]
        return replace(self, snapshots=tuple(s for s in self.snapshots + (entry,) if s in kept)), dropped

