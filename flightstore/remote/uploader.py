"""Uploading to remote storage: closed log segments, KV snapshots, and the local segments that may
then go (Fluss's remote log manager).

Every ``remote.log.task-interval-duration`` the server's :class:`RemoteLogManager` visits each open
table's buckets and

1. uploads every closed local segment not uploaded yet, oldest first: its files (segment, index,
   summary) into a new folder, then the log manifest that lists it (with its offsets, sizes and
   checksums, and the log's schema epochs). A crash before the manifest leaves an orphan folder
   nobody reads; the segment is uploaded again next time;
2. uploads every completed KV snapshot newer than the newest uploaded one (the checkpoint files,
   the image and its manifest), then the KV manifest, keeping the ``kv.snapshot.num-retained``
   newest remotely (the older ones' files are deleted after the manifest no longer lists them);
3. deletes local segments beyond the newest ``table.log.tiered.local-segments`` closed ones, and
   only those the log manifest lists: never one before it is uploaded.

A local segment that overlaps the uploaded ones without being one of them (a log that diverged
from what was uploaded) is never uploaded over them nor deleted; it is logged. Expiry of uploaded
segments by ``table.log.ttl`` runs with the local retention (:meth:`RemoteBucket.expire`).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from flightstore.errors import FlightstoreError
from flightstore.kv.snapshot import KvSnapshots, SnapshotInfo
from flightstore.log import LogTablet
from flightstore.log.schemas import EPOCHS_FILE
from flightstore.log.segment import Segment, segment_name
from flightstore.remote.bucket import RemoteBucket
from flightstore.remote.manifest import SegmentEntry, SnapshotEntry
from flightstore.remote.storage import RemoteFile, new_token

__all__ = ["RemoteLogManager", "release_uploaded", "upload_segments", "upload_snapshots"]

log = logging.getLogger("flightstore.remote")


def _changing_manifests(function: Callable[..., int]) -> Callable[..., int]:
    """Run ``function(bucket, ...)`` holding ``bucket.writing`` (see RemoteBucket)."""
    @functools.wraps(function)
    def holding(bucket: RemoteBucket, *args: Any) -> int:
        with bucket.writing:
            return function(bucket, *args)
    return holding


@_changing_manifests
def upload_segments(bucket: RemoteBucket, tablet: LogTablet) -> int:
    """Upload the closed segments of ``tablet`` that are not uploaded yet, then write the log
    manifest listing them (once: the files of every segment first); returns how many."""
    # Only a bucket's leader uploads, and only committed records (below the high watermark):
    # what remote storage holds is the same on every replica and never truncated by a failover.
    if not tablet.leading:
        return 0
    sealed = [s for s in tablet.sealed_segments() if s.next_offset <= tablet.high_watermark]
    if not sealed:
        return 0  # (nothing to ask remote storage)
    committed = manifest = bucket.log_manifest()
    uploaded = 0
    try:
        for segment in sealed:
            if manifest.holds(segment.base_offset, segment.next_offset, segment.size):
                continue
            end = manifest.end_offset
            if end is not None and segment.base_offset < end:
                if segment.next_offset > end:
                    log.error("%s: local segment %s (offsets %d..%d) overlaps the uploaded segments "
                              "(which end at %d) without being one of them; it stays local and is "
                              "not uploaded", bucket.label, segment.path.name, segment.base_offset,
                              segment.next_offset - 1, end)
                    break
                continue  # below the uploaded end but not one of them: it stays local
            entry = _put_segment(bucket, segment)
            if entry is None:
                break  # deleted locally meanwhile (retention): the next round sees the new state
            manifest = manifest.with_segment(entry, _schema_epochs(tablet))
            uploaded += 1
    finally:  # what is uploaded counts, also when a later segment failed
        if manifest is not committed:
            bucket.commit_log(manifest)
    return uploaded


def _put_segment(bucket: RemoteBucket, segment: Segment) -> SegmentEntry | None:
    folder = f"log/{segment_name(segment.base_offset)}-{new_token()}"
    base = f"{bucket.path}/{folder}"
    try:
        files = tuple(bucket.storage.put_file(path, f"{base}/{path.name}")
                      for path in (segment.path, segment.index_path, segment.summary_path))
    except FileNotFoundError:
        bucket.storage.delete_dir(base)
        return None
    return SegmentEntry(segment.base_offset, segment.next_offset, segment.records_count,
                        segment.size, segment.max_timestamp_ms, segment.lost_rows,
                        dict(segment.writers), folder, files)


def _schema_epochs(tablet: LogTablet) -> list[tuple[int, int]] | None:
    """The log's schema epochs as its directory records them (see flightstore.log.schemas)."""
    try:
        return [(int(v), int(o)) for v, o in json.loads((tablet.directory / EPOCHS_FILE).read_text())]
    except FileNotFoundError:
        return None


@_changing_manifests
def release_uploaded(bucket: RemoteBucket, tablet: LogTablet, keep: int) -> int:
    """Delete the local closed segments beyond the newest ``keep`` that are uploaded (a run from
    the oldest; it stops at the first one that is not); returns how many."""
    sealed = tablet.sealed_segments()
    if len(sealed) <= keep:
        return 0
    manifest = bucket.log_manifest()
    upto = None
    for segment in sealed[:max(len(sealed) - keep, 0)]:
        if not manifest.holds(segment.base_offset, segment.next_offset, segment.size):
            break
        upto = segment.next_offset
    return 0 if upto is None else tablet.release_local(upto)


@_changing_manifests
def upload_snapshots(bucket: RemoteBucket, snapshots: KvSnapshots, retained: int) -> int:
    """Upload the completed KV snapshots newer than the newest uploaded one, keeping the
    ``retained`` newest remotely; returns how many were uploaded."""
    local = snapshots.list()
    if not local:
        return 0
    manifest = bucket.kv_manifest()
    uploaded = 0
    for snapshot in local:
        if manifest.holds(snapshot.id, snapshot.offset, snapshot.created_ms):
            continue
        newest = manifest.newest
        if newest is not None and snapshot.offset <= newest.offset:
            continue
        entry = _put_snapshot(bucket, snapshot)
        if entry is None:
            continue  # deleted locally meanwhile (a newer one replaced it)
        manifest, dropped = manifest.with_snapshot(entry, retained)
        manifest = bucket.commit_kv(manifest)
        for old in dropped:
            bucket.storage.delete_dir(f"{bucket.path}/{old.folder}")
        uploaded += 1
    return uploaded


def _put_snapshot(bucket: RemoteBucket, snapshot: SnapshotInfo) -> SnapshotEntry | None:
    folder = f"kv/snapshot-{snapshot.id}-{new_token()}"
    base = f"{bucket.path}/{folder}"
    files = []
    try:
        for path in sorted(p for p in snapshot.directory.rglob("*") if p.is_file()):
            name = path.relative_to(snapshot.directory).as_posix()
            stored = bucket.storage.put_file(path, f"{base}/{name}")
            files.append(RemoteFile(name, stored.size, stored.sha256))
    except FileNotFoundError:
        bucket.storage.delete_dir(base)
        return None
    if not snapshot.directory.is_dir():  # deleted while uploading: some files may be missing
        bucket.storage.delete_dir(base)
        return None
    return SnapshotEntry(snapshot.id, snapshot.offset, snapshot.rows, snapshot.created_ms, folder,
                         tuple(files))


class RemoteLogManager:
    """The background thread of one server that uploads to remote storage (see module doc)."""

    def __init__(self, store: Any, interval_ms: int) -> None:
        self.store = store
        self.interval_s = interval_ms / 1000
        self._stop = threading.Event()
        self._round = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="flightstore-remote-log", daemon=True)

    def start(self) -> RemoteLogManager:
        if self.interval_s > 0:
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait for it (an upload in progress finishes its file first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the thread must live on; the next round retries
                if not self._stop.is_set():
                    log.exception("remote log task failed")

    def run_once(self) -> dict[str, int]:
        """One round over every open table (the thread's work, callable directly): returns the
        segments uploaded, snapshots uploaded and local segments deleted."""
        done = {"segments": 0, "snapshots": 0, "released": 0}
        with self._round:
            for table in self.store.open_tables():
                if self._stop.is_set():
                    break
                descriptor = table.descriptor
                keep = descriptor.option("table.log.tiered.local-segments")
                retained = descriptor.option("kv.snapshot.num-retained")
                for tablet, kv in table.tablets().values():
                    bucket = tablet.remote
                    if bucket is None or tablet.closed:
                        continue
                    try:
                        with bucket.writing:
                            done["segments"] += upload_segments(bucket, tablet)
                            if kv is not None and tablet.leading:
                                done["snapshots"] += upload_snapshots(bucket, kv.snapshots, retained)
                            done["released"] += release_uploaded(bucket, tablet, keep)
                    except (FlightstoreError, OSError) as exc:
                        log.warning("%s: remote storage upload failed, retrying next round: %s",
                                    bucket.label, exc)
        if any(done.values()):
            log.info("remote storage: uploaded %d segment(s) and %d KV snapshot(s), deleted %d "
                     "local segment(s)", done["segments"], done["snapshots"], done["released"])
        return done
