"""KV snapshots of one bucket: a RocksDB checkpoint and a columnar image at one log offset.

A snapshot is what lets a primary-key table forget its old changelog: the KV can be rebuilt from
the newest usable snapshot plus the log after its offset, so the log below the *oldest retained*
snapshot (:meth:`KvSnapshots.retention_floor`) may be deleted by ``table.log.ttl``.

On disk, next to the bucket's ``kv`` directory::

    snapshots/00000000000000000007/
        db/              a RocksDB checkpoint (SST files hard-linked, the rest copied)
        image.arrow      the rows in key order (:mod:`flightstore.kv.image`)
        snapshot.json    the manifest: id, log offset, rows, creation time, image size/CRC/stats

Atomicity: a snapshot is built in ``<id>.tmp/`` and becomes visible by one ``rename`` to ``<id>/``
after every file in it is fsynced (the manifest last); the parent directory is fsynced after the
rename. A crash before the rename leaves a ``.tmp`` directory that the next open deletes; the
previous snapshots are untouched. Old snapshots are deleted only after a newer one is complete, by
renaming them to ``<id>.deleting`` first, so a crash mid-delete never leaves a half snapshot that
looks valid. On open, every snapshot directory is checked (manifest, image size, checkpoint
present); one that fails is logged and deleted, and the older ones stay usable.

The checkpoint is taken under the tablet's write lock (a flush and hard links: milliseconds), so
it holds exactly the rows at the applied offset; the image is then written from the checkpoint
(a read-only RocksDB instance) without holding any lock.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from flightstore.errors import CorruptData
from flightstore.kv.encoding import RowCodec
from flightstore.kv.image import Image, ImageInfo, write_image

__all__ = ["KvSnapshots", "SnapshotInfo", "SnapshotSchedule", "directory_bytes", "open_checkpoint"]

log = logging.getLogger("flightstore.kv")

MANIFEST = "snapshot.json"
IMAGE = "image.arrow"
CHECKPOINT = "db"
FORMAT = 1
_TMP = ".tmp"
_DELETING = ".deleting"
_SKIP_ON_RESTORE = ("LOCK", "LOG")  # per-instance files RocksDB recreates


@dataclass(frozen=True)
class SnapshotInfo:
    """One complete snapshot: ``offset`` is the log offset it covers (every change below it)."""

    id: int
    offset: int
    rows: int
    created_ms: int
    directory: Path
    image: ImageInfo

    @property
    def checkpoint(self) -> Path:
        return self.directory / CHECKPOINT

    @property
    def image_path(self) -> Path:
        return self.directory / IMAGE

    def to_json(self) -> dict:
        return {"format": FORMAT, "id": self.id, "offset": self.offset, "rows": self.rows,
                "created_ms": self.created_ms, "image": self.image.to_json()}


def _name(snapshot_id: int) -> str:
    return f"{snapshot_id:020d}"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _meta_options() -> dict:
    return {"meta": Options(raw_mode=True)}


def open_checkpoint(path: Path, read_only: bool = True) -> Rdict:
    """A RocksDB instance over a checkpoint directory (read-only unless told otherwise)."""
    access = AccessType.read_only() if read_only else AccessType.read_write()
    return Rdict(str(path), options=Options(raw_mode=True), column_families=_meta_options(),
                 access_type=access)


class KvSnapshots:
    """The snapshots of one bucket's KV: listing, validation, creation, retention and restore.

    Thread-safe: creations are serialized, readers get immutable :class:`SnapshotInfo` values and
    :class:`Image` objects that keep their files mapped even if the snapshot is deleted meanwhile.
    """

    def __init__(self, directory: str | os.PathLike, retained: int, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.retained = max(1, int(retained))
        self.fsync = fsync
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._snapshots: list[SnapshotInfo] = []
        self._images: dict[int, Image] = {}
        self._bad_images: set[int] = set()
        self.load()

    # ---- listing ------------------------------------------------------------------------------
    def load(self) -> list[SnapshotInfo]:
        """(Re)read the snapshot directory: delete leftovers of interrupted creations/deletions,
        invalid snapshots (logging why) and valid ones beyond ``retained`` (oldest first); keep the
        rest sorted by id."""
        found: list[SnapshotInfo] = []
        if self.directory.is_dir():
            for entry in sorted(self.directory.iterdir()):
                if entry.name.endswith(_TMP) or entry.name.endswith(_DELETING):
                    shutil.rmtree(entry, ignore_errors=True)
                    continue
                if not entry.name.isdigit():
                    continue
                try:
                    found.append(self._read_manifest(entry))
                except CorruptData as exc:
                    log.warning("%s: ignoring and deleting an invalid KV snapshot: %s", self.directory, exc)
                    self._remove(entry)
        found.sort(key=lambda s: s.id)
        for old in found[:-self.retained]:  # a crash between publishing a snapshot and pruning
            self._remove(old.directory)
        with self._lock:
            self._snapshots = found[-self.retained:]
            return list(self._snapshots)

    def _read_manifest(self, directory: Path) -> SnapshotInfo:
        try:
            data = json.loads((directory / MANIFEST).read_bytes())
            info = SnapshotInfo(int(data["id"]), int(data["offset"]), int(data["rows"]),
                                int(data["created_ms"]), directory, ImageInfo.from_json(data["image"]))
            if data.get("format") != FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
        except FileNotFoundError:
            raise CorruptData(f"{directory} has no manifest") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptData(f"{directory}: unreadable manifest ({exc})") from None
        if info.id != int(directory.name):
            raise CorruptData(f"{directory}: the manifest names snapshot {info.id}")
        if not (directory / CHECKPOINT / "CURRENT").is_file():
            raise CorruptData(f"{directory}: the RocksDB checkpoint is missing")
        try:
            size = (directory / IMAGE).stat().st_size
        except FileNotFoundError:
            raise CorruptData(f"{directory}: the image is missing") from None
        if size != info.image.bytes:
            raise CorruptData(f"{directory}: the image holds {size} bytes, the manifest says "
                              f"{info.image.bytes}")
        return info

    def list(self) -> list[SnapshotInfo]:
        """Valid snapshots, oldest first."""
        with self._lock:
            return list(self._snapshots)

    @property
    def newest(self) -> SnapshotInfo | None:
        with self._lock:
            return self._snapshots[-1] if self._snapshots else None

    def at_or_before(self, offset: int) -> SnapshotInfo | None:
        """The newest snapshot covering at most ``offset`` (its image plus the log from its offset
        to ``offset`` gives the rows at ``offset``)."""
        with self._lock:
            usable = [s for s in self._snapshots if s.offset <= offset]
        return usable[-1] if usable else None

    def retention_floor(self) -> int:
        """The highest log offset below which the log may be deleted: the oldest retained
        snapshot's offset (0 without snapshots), so every retained snapshot stays usable."""
        with self._lock:
            return self._snapshots[0].offset if self._snapshots else 0

    def drop_after(self, offset: int) -> list[int]:
        """Delete the snapshots of offsets above ``offset`` (the log was cut there: they hold changes
        it no longer has); returns their ids."""
        with self._lock:
            doomed = [s for s in self._snapshots if s.offset > offset]
            self._snapshots = [s for s in self._snapshots if s.offset <= offset]
            for snapshot in doomed:
                self._images.pop(snapshot.id, None)
        for snapshot in doomed:
            self._remove(snapshot.directory)
        return [s.id for s in doomed]

    # ---- images -------------------------------------------------------------------------------
    def image(self, snapshot: SnapshotInfo, schema) -> Image | None:
        """The opened image of ``snapshot`` (cached), or None when it fails its checks (logged
        once; readers then use RocksDB instead)."""
        with self._lock:
            cached = self._images.get(snapshot.id)
            if cached is not None or snapshot.id in self._bad_images:
                return cached
        try:
            image = Image(snapshot.image_path, snapshot.image, schema)
        except CorruptData as exc:
            log.error("%s: KV snapshot %d's image is unusable, scans read RocksDB instead: %s",
                      self.directory, snapshot.id, exc)
            with self._lock:
                self._bad_images.add(snapshot.id)
            return None
        with self._lock:
            if any(s.id == snapshot.id for s in self._snapshots):
                self._images[snapshot.id] = image
        return image

    def release_images(self) -> None:
        """Forget the opened images (their maps close once no reader holds a batch of them)."""
        with self._lock:
            self._images.clear()
            self._bad_images.clear()

    # ---- creation -----------------------------------------------------------------------------
    def create(self, checkpoint: Callable[[Path], tuple[int, int] | None], codec: RowCodec,
               primary_key: Sequence[str], statistics_columns: Sequence[str], *,
               stop: Callable[[], bool] | None = None) -> SnapshotInfo | None:
        """Take a snapshot; return it, or None when ``checkpoint`` declined (nothing changed).

        ``checkpoint(path)`` must write a RocksDB checkpoint of the live KV at ``path`` under the
        tablet's write lock and return the applied offset and row count it holds (or None to
        skip: nothing changed since the newest snapshot). The image
        is written from that checkpoint, then the snapshot is published atomically and snapshots
        beyond ``retained`` are deleted. On any failure (or ``stop``) the partial snapshot is
        removed and the previous ones are untouched.
        """
        with self._create_lock:
            newest = self.newest
            snapshot_id = (newest.id if newest else 0) + 1
            final = self.directory / _name(snapshot_id)
            tmp = self.directory / (_name(snapshot_id) + _TMP)
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                held = checkpoint(tmp / CHECKPOINT)
                if held is None:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return None
                offset, rows = held
                info = self._build(tmp, final, snapshot_id, offset, rows, codec, primary_key,
                                   statistics_columns, stop)
                os.rename(tmp, final)
                if self.fsync:
                    _fsync_path(self.directory)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            with self._lock:
                self._snapshots.append(info)
                expired = self._snapshots[:-self.retained]
                self._snapshots = self._snapshots[-self.retained:]
                for old in expired:
                    self._images.pop(old.id, None)
            for old in expired:
                self._remove(old.directory)
            return info

    def _build(self, tmp: Path, final: Path, snapshot_id: int, offset: int, stored_rows: int,
               codec: RowCodec, primary_key: Sequence[str], statistics_columns: Sequence[str],
               stop: Callable[[], bool] | None) -> SnapshotInfo:
        db = open_checkpoint(tmp / CHECKPOINT)
        try:
            image = write_image(tmp / IMAGE, db.values(), codec, primary_key, statistics_columns,
                                stop=stop, fsync=self.fsync)
        finally:
            db.close()
        for leftover in _SKIP_ON_RESTORE:  # written by the read-only open, not part of the snapshot
            (tmp / CHECKPOINT / leftover).unlink(missing_ok=True)
        if stored_rows != image.rows:
            log.warning("%s: snapshot %d holds %d rows but the KV's row count says %d", self.directory,
                        snapshot_id, image.rows, stored_rows)
        info = SnapshotInfo(snapshot_id, offset, image.rows, int(time.time() * 1000), final, image)
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps(info.to_json(), separators=(",", ":")))
        if self.fsync:
            _fsync_path(manifest)
            _fsync_path(tmp)
        return info

    def _remove(self, directory: Path) -> None:
        """Delete a snapshot directory: renamed away first, so a crash mid-delete leaves nothing
        that looks like a snapshot."""
        doomed = directory.with_name(directory.name + _DELETING)
        try:
            os.rename(directory, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- copies between replicas -------------------------------------------------------------
    def files(self, snapshot: SnapshotInfo) -> Iterator[tuple[str, bytes]]:
        """Every file of ``snapshot`` as ``(path relative to it, bytes)``, the manifest last (a
        replica copies a snapshot to a follower that cannot catch up from the log alone)."""
        for path in sorted(snapshot.directory.rglob("*")):
            if path.is_file() and path.name != MANIFEST:
                yield str(path.relative_to(snapshot.directory)), path.read_bytes()
        yield MANIFEST, (snapshot.directory / MANIFEST).read_bytes()

    def install(self, files: Iterable[tuple[str, bytes]]) -> SnapshotInfo:
        """Take a snapshot copied from another replica (:meth:`files`): written under a temporary
        name, checked like any snapshot, then published under its id (replacing one of that id)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f"incoming{_TMP}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            for relative, data in files:
                target = (staging / relative).resolve()
                if staging.resolve() not in target.parents:
                    raise CorruptData(f"a copied KV snapshot names a file outside it: {relative!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            snapshot_id = int(json.loads((staging / MANIFEST).read_bytes())["id"])
            final = self.directory / _name(snapshot_id)
            with self._create_lock:
                if final.exists():
                    self._remove(final)
                os.rename(staging, final)
                if self.fsync:
                    _fsync_path(self.directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return next(s for s in self.load() if s.id == snapshot_id)

    # ---- restore ------------------------------------------------------------------------------
    def restore(self, snapshot: SnapshotInfo, target: Path) -> None:
        """Make ``target`` a copy of ``snapshot``'s checkpoint (SST files hard-linked: they are
        immutable; the rest copied), replacing whatever ``target`` held. The copy is assembled
        next to ``target`` and renamed into place."""
        staging = target.with_name(target.name + ".restore")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for source in snapshot.checkpoint.iterdir():
                if source.name in _SKIP_ON_RESTORE or source.name.startswith("LOG."):
                    continue
                if source.suffix == ".sst":
                    os.link(source, staging / source.name)
                else:
                    shutil.copy2(source, staging / source.name)
            if target.exists():
                shutil.rmtree(target)
            os.rename(staging, target)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise CorruptData(f"cannot restore KV snapshot {snapshot.directory}: {exc}") from None

    def disk_bytes(self, seen: set | None = None) -> int:
        """Bytes the snapshots occupy (each file once, hard links shared with the KV counted once
        when ``seen`` is shared with the KV's count)."""
        return directory_bytes(self.directory, seen)


def directory_bytes(directory: Path, seen: set | None = None) -> int:
    """Allocated bytes of every file under ``directory``, each inode once (hard links between a
    KV and its checkpoints are counted once when ``seen`` is shared)."""
    seen = set() if seen is None else seen
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_blocks * 512
    return total



class SnapshotSchedule:
    """When each bucket of a table is next due for a snapshot: ``interval_ms`` after its last one
    (or after the table was opened), checked by the server's background thread."""

    def __init__(self, interval_ms: int, last_created_ms: Sequence[int | None], now_ms: int) -> None:
        self.interval_ms = int(interval_ms)
        self._due = [(now_ms if created is None else created) + self.interval_ms
                     for created in last_created_ms]
        self._lock = threading.Lock()

    def due(self, now_ms: int) -> list[int]:
        """The buckets whose snapshot is due at ``now_ms``."""
        with self._lock:
            return [bucket for bucket, due in enumerate(self._due) if due <= now_ms]

    def done(self, bucket: int, now_ms: int) -> None:
        """Bucket ``bucket`` was snapshotted (or found unchanged) at ``now_ms``."""
        with self._lock:
            self._due[bucket] = now_ms + self.interval_ms

    def next_due_ms(self) -> int:
        with self._lock:
            return min(self._due)
