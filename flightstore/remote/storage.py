"""Remote storage (``remote.data.dir``): one pyarrow file system, where tables and buckets live in
it, and checked file transfers.

Layout under ``remote.data.dir``::

    <namespace>/<database>/<table>-<table id>/[p-<partition id>/]bucket-<n>/
        log/manifest/<version>.json                  the bucket's remote log manifest
        log/<base offset>-<token>/<base offset>.log  one uploaded segment, with its .index and .summary
        kv/manifest/<version>.json                   the bucket's remote KV snapshot manifest
        kv/snapshot-<id>-<token>/...                 one uploaded KV snapshot: db/ (the RocksDB
                                                     checkpoint), image.arrow, snapshot.json

* ``namespace``: ``standalone`` for a server alone, ``server-<id>`` for a server with a
  ``server.id`` (a cluster passes its own; see :class:`RemoteStorage`).
* ``table id``: the name of the table's local data directory, which the catalog makes a fresh uuid
  at CREATE TABLE: a dropped and re-created table never mixes with the old one. ``<table>`` is the
  table's name when it first uploaded: a renamed table keeps its directory, found by its id.
* ``partition id``: the catalog's partition id (never reused), as in the local layout.
* Every uploaded folder carries a random token, so an upload retried after a crash never
  overwrites a file that a manifest references; manifests (:mod:`flightstore.remote.manifest`) say
  which files make the bucket, with each file's size and SHA-256, and every download is checked
  against them.

Transfers stream in chunks (bounded memory). Any failure to reach the storage is
:class:`~flightstore.errors.RemoteStorageUnavailable`; a file that is missing is
``FileNotFoundError`` (callers know whether that is data loss); one whose bytes do not match its
manifest is :class:`~flightstore.errors.DataLoss` naming it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from flightstore.config import SERVER_OPTIONS, server_option
from flightstore.errors import DataLoss, FlightstoreError, InvalidOption, RemoteStorageUnavailable
from flightstore.remote.cache import SegmentCache
from flightstore.schema import TableDescriptor

if TYPE_CHECKING:
    from flightstore.remote.bucket import RemoteBucket

__all__ = ["CHUNK_BYTES", "RemoteFile", "RemoteStorage", "RemoteTable", "new_token"]

log = logging.getLogger("flightstore.remote")

CHUNK_BYTES = 4 * 1024 * 1024
CACHE_DIR = "remote-cache"
_S3_OPTIONS = ("remote.s3.endpoint", "remote.s3.access-key-id", "remote.s3.secret-access-key",
               "remote.s3.region")


def new_token() -> str:
    """A random suffix that makes an uploaded folder's name unique."""
    return secrets.token_hex(6)


@dataclass(frozen=True)
class RemoteFile:
    """One uploaded file: its ``name`` inside its folder (may hold ``/``), size and SHA-256."""

    name: str
    size: int
    sha256: str

    def to_json(self) -> list:
        return [self.name, self.size, self.sha256]

    @classmethod
    def from_json(cls, data: Any) -> RemoteFile:
        name, size, digest = data
        return cls(str(name), int(size), str(digest))


class RemoteStorage:
    """``remote.data.dir``: a file system, a root path in it, a namespace and a download cache."""

    def __init__(self, filesystem: pafs.FileSystem, root: str, *, namespace: str = "standalone",
                 cache_dir: Path | None = None, cache_bytes: int = 1024**3, uri: str | None = None) -> None:
        """``cache_dir``: where remote segments are downloaded to be read (emptied now; default a
        temporary directory is not made: give one); ``cache_bytes`` bounds it."""
        self.filesystem = filesystem
        self.root = root.rstrip("/")
        self.namespace = namespace
        self.uri = uri or self.root
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        self.cache = SegmentCache(cache_dir, cache_bytes) if cache_dir is not None else None
        self._tables: dict[tuple[str, str], str] = {}  # (database, table id) -> directory name
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: Mapping[str, Any], data_dir: str | os.PathLike,
                     namespace: str | None = None) -> RemoteStorage | None:
        """The remote storage the server options configure, or None without ``remote.data.dir``.

        Options of remote storage given without ``remote.data.dir``, or S3 options with a
        ``remote.data.dir`` that is not ``s3://``, are refused (:class:`InvalidOption`): no option
        is accepted and then ignored."""
        given = sorted(k for k, v in options.items() if k.startswith("remote.") and v is not None)
        for key in given:  # each parses; an unknown remote.* key is refused by name
            if key not in SERVER_OPTIONS:
                raise InvalidOption(f"unknown server option '{key}'")
            server_option(options, key)
        uri = server_option(options, "remote.data.dir")
        if uri is None:
            if given:
                raise InvalidOption(f"option '{given[0]}' needs 'remote.data.dir' (remote storage is off)")
            return None
        uri = str(uri).strip()
        if not uri:
            raise InvalidOption("option 'remote.data.dir': empty")
        s3 = [k for k in given if k in _S3_OPTIONS]
        if uri.startswith("s3://"):
            filesystem, root = _s3(options, uri)
        else:
            if s3:
                raise InvalidOption(f"option '{s3[0]}' needs an s3:// 'remote.data.dir', not {uri!r}")
            try:
                filesystem, root = pafs.FileSystem.from_uri(
                    uri if "://" in uri else os.path.abspath(uri))
            except (pa.ArrowException, ValueError, OSError) as exc:
                raise InvalidOption(f"option 'remote.data.dir': {uri!r} is not a usable file system "
                                    f"URI ({exc})") from None
        if namespace is None:
            server_id = server_option(options, "server.id")
            namespace = "standalone" if server_id is None else f"server-{server_id}"
        return cls(filesystem, root, namespace=namespace, uri=uri,
                   cache_dir=Path(data_dir) / CACHE_DIR,
                   cache_bytes=server_option(options, "remote.log.cache-size"))

    def __repr__(self) -> str:
        return f"RemoteStorage({self.uri!r}, namespace={self.namespace!r})"

    # ---- layout -------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """The full path of ``parts`` under this storage's namespace."""
        return "/".join([self.root, self.namespace, *parts])

    def table(self, descriptor: TableDescriptor, table_id: str, *, fresh: bool = False) -> RemoteTable:
        """The table of ``descriptor`` whose local directory (its id) is named ``table_id``;
        ``fresh``: created just now (nothing of it can be stored: opening it asks nothing)."""
        return RemoteTable(self, descriptor.path.database, descriptor.path.table, table_id,
                           descriptor.has_primary_key, fresh=fresh)

    def table_directory(self, database: str, table: str, table_id: str) -> str:
        """``<database>/<table>-<table id>``: the existing directory of ``table_id`` (whatever the
        table's name is now), or a new one named after ``table``."""
        key = (database, table_id)
        with self._lock:
            known = self._tables.get(key)
        if known is not None:
            return known
        suffix = f"-{table_id}"
        found = [name for name in self.list_dir(self.path(database)) if name.endswith(suffix)]
        directory = f"{database}/{found[0] if found else table + suffix}"
        with self._lock:
            return self._tables.setdefault(key, directory)

    def drop_tables(self, database: str, table_ids: list[str]) -> None:
        """Delete everything stored of the dropped tables ``table_ids``. Best effort: what cannot
        be deleted now stays behind (logged) and is never read again (a new table has a new id)."""
        try:
            names = self.list_dir(self.path(database)) if table_ids else []
            for table_id in table_ids:
                for name in names:
                    if name.endswith(f"-{table_id}"):
                        self.delete_dir(self.path(database, name))
                with self._lock:
                    self._tables.pop((database, table_id), None)
        except FlightstoreError as exc:
            log.warning("remote storage of dropped tables of %s not deleted: %s", database, exc)

    def drop_partitions(self, descriptor: TableDescriptor, table_id: str,
                        partition_ids: list[int]) -> None:
        """Delete everything stored of the dropped partitions ``partition_ids`` (best effort)."""
        table = self.table(descriptor, table_id)
        for partition_id in partition_ids:
            try:
                table.partition(partition_id).delete()
            except FlightstoreError as exc:
                log.warning("remote storage of dropped partition %d of %s not deleted: %s",
                            partition_id, descriptor.path, exc)

    # ---- files --------------------------------------------------------------------------------
    def list_dir(self, directory: str) -> list[str]:
        """Names of the entries directly under ``directory`` (none when it does not exist)."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        except (pa.ArrowException, OSError) as exc:
            raise self._unavailable(f"listing {directory}", exc) from None
        return sorted(info.base_name for info in infos)

    def put_file(self, local: Path, remote: str) -> RemoteFile:
        """Copy ``local`` to ``remote``; returns what was written (``FileNotFoundError`` when
        ``local`` is gone)."""
        digest = hashlib.sha256()
        size = 0
        with open(local, "rb") as source:
            self._make_parent(remote)
            try:
                with self.filesystem.open_output_stream(remote) as sink:
                    while chunk := source.read(CHUNK_BYTES):
                        digest.update(chunk)
                        sink.write(chunk)
                        size += len(chunk)
            except (pa.ArrowException, OSError) as exc:
                raise self._unavailable(f"writing {remote}", exc) from None
        return RemoteFile(os.path.basename(remote), size, digest.hexdigest())

    def put_bytes(self, data: bytes, remote: str) -> None:
        self._make_parent(remote)
        try:
            with self.filesystem.open_output_stream(remote) as sink:
                sink.write(data)
        except (pa.ArrowException, OSError) as exc:
            raise self._unavailable(f"writing {remote}", exc) from None

    def get_bytes(self, remote: str) -> bytes:
        """The bytes of ``remote`` (``FileNotFoundError`` when it does not exist)."""
        try:
            with self.filesystem.open_input_stream(remote) as source:
                return source.read()
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise self._missing_or_unavailable(remote, exc) from None

    def get_file(self, remote: str, local: Path, expected: RemoteFile, label: str) -> None:
        """Copy ``remote`` to ``local``, checking it against ``expected`` (size and SHA-256):
        :class:`DataLoss` naming it (and ``label``, the table and bucket) when it differs,
        ``FileNotFoundError`` when it does not exist."""
        digest = hashlib.sha256()
        size = 0
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.filesystem.open_input_stream(remote) as source, open(local, "wb") as sink:
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    sink.write(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise self._missing_or_unavailable(remote, exc) from None
        if size != expected.size or digest.hexdigest() != expected.sha256:
            raise DataLoss(f"{label}: remote file {self.uri_of(remote)} fails its checksum ({size} "
                           f"bytes, SHA-256 {digest.hexdigest()[:16]}...; its manifest recorded "
                           f"{expected.size} bytes, {expected.sha256[:16]}...)")

    def delete_dir(self, directory: str) -> None:
        """Delete ``directory`` and everything under it (nothing when it does not exist)."""
        try:
            self.filesystem.delete_dir(directory)
        except FileNotFoundError:
            pass
        except (pa.ArrowException, OSError) as exc:
            if self.filesystem.get_file_info(directory).type != pafs.FileType.NotFound:
                raise self._unavailable(f"deleting {directory}", exc) from None

    def delete_file(self, remote: str) -> None:
        try:
            self.filesystem.delete_file(remote)
        except FileNotFoundError:
            pass
        except (pa.ArrowException, OSError) as exc:
            raise self._unavailable(f"deleting {remote}", exc) from None

    def uri_of(self, remote: str) -> str:
        """``remote`` as the user configured the storage (for messages)."""
        relative = remote[len(self.root):] if remote.startswith(self.root) else "/" + remote
        return self.uri.rstrip("/") + relative

    def _make_parent(self, remote: str) -> None:
        if self._local:  # object stores have no directories
            self.filesystem.create_dir(remote.rsplit("/", 1)[0], recursive=True)

    def _missing_or_unavailable(self, remote: str, exc: Exception) -> Exception:
        """Object stores answer a missing key with a plain OSError: ask whether it exists."""
        try:
            missing = self.filesystem.get_file_info(remote).type == pafs.FileType.NotFound
        except (pa.ArrowException, OSError):
            missing = False
        if missing:
            return FileNotFoundError(f"{self.uri_of(remote)} does not exist")
        return self._unavailable(f"reading {remote}", exc)

    def _unavailable(self, what: str, exc: Exception) -> RemoteStorageUnavailable:
        return RemoteStorageUnavailable(f"remote storage {self.uri}: {what} failed ({exc})")


class RemoteTable:
    """One table in remote storage, or one partition of a partitioned table: its buckets."""

    def __init__(self, storage: RemoteStorage, database: str, table: str, table_id: str,
                 has_primary_key: bool, partition: str | None = None, fresh: bool = False) -> None:
        self.storage = storage
        self.database = database
        self.name = table
        self.table_id = table_id
        self.has_primary_key = has_primary_key
        self.partition_dir = partition
        self.fresh = fresh  # just created: a missing bucket directory is new, not lost

    def partition(self, partition_id: int, fresh: bool = False) -> RemoteTable:
        """Partition ``partition_id`` of this (partitioned) table (``fresh``: just added)."""
        return RemoteTable(self.storage, self.database, self.name, self.table_id,
                           self.has_primary_key, f"p-{partition_id}", self.fresh or fresh)

    @property
    def path(self) -> str:
        """The full path of this table's (or partition's) directory."""
        parts = [self.storage.table_directory(self.database, self.name, self.table_id)]
        if self.partition_dir is not None:
            parts.append(self.partition_dir)
        return self.storage.path(*parts)

    def bucket_path(self, bucket: int) -> str:
        """The full path of bucket ``bucket``'s directory."""
        return f"{self.path}/bucket-{bucket}"

    def delete(self) -> None:
        """Delete everything stored of this table or partition (it was dropped)."""
        self.storage.delete_dir(self.path)

    def bucket(self, bucket: int, label: str, local: Path | None = None) -> RemoteBucket:
        """Bucket ``bucket`` (``label`` names it in errors: table and bucket; ``local``: its local
        directory, see :class:`~flightstore.remote.bucket.RemoteBucket`)."""
        from flightstore.remote.bucket import RemoteBucket
        return RemoteBucket(self, bucket, label, local)


def _s3(options: Mapping[str, Any], uri: str) -> tuple[pafs.FileSystem, str]:
    kwargs: dict[str, Any] = {}
    endpoint = server_option(options, "remote.s3.endpoint")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parsed.netloc
        kwargs["scheme"] = parsed.scheme
    for key, name in (("remote.s3.access-key-id", "access_key"),
                      ("remote.s3.secret-access-key", "secret_key"), ("remote.s3.region", "region")):
        value = server_option(options, key)
        if value:
            kwargs[name] = value
    if ("access_key" in kwargs) != ("secret_key" in kwargs):
        raise InvalidOption("options 'remote.s3.access-key-id' and 'remote.s3.secret-access-key' "
                            "go together")
    root = uri[len("s3://"):].strip("/")
    if not root:
        raise InvalidOption(f"option 'remote.data.dir': {uri!r} names no bucket")
    try:
        return pafs.S3FileSystem(**kwargs), root
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise InvalidOption(f"option 'remote.data.dir': cannot use {uri!r} ({exc})") from None
