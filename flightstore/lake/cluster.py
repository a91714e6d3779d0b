"""The lake in cluster mode: one tierer for the whole cluster, every server following its commits.

Why it is built this way:

* **One tierer at a time**, the server holding the ephemeral znode ``<root>/lake/tierer``
  (:class:`ClusterLake`). A table's round is ONE Iceberg commit recording every bucket's offset
  (:mod:`flightstore.lake.tiering`); tiering per bucket leader would make several servers race
  for every table's metadata (each commit conflicting with the others) and several processes
  write the catalog. One writer keeps a shared sqlite catalog safe too (sqlite serialises
  writers across processes with file locks; readers wait out a write).
* **The lease is an ephemeral znode**: it goes with its holder's ZooKeeper session (a kill -9
  frees it after the session timeout, then another server takes it), and the holder checks that
  the znode is still its own (``ephemeralOwner`` = its session) before each round and again
  right before each commit. Correctness does not rest on the lease: every commit asserts the
  snapshot its round started from, so a deposed tierer whose check raced its session's expiry
  fails its commit instead of doubling rows, and the next tierer starts from the committed
  offsets (no duplicate, no gap).
* **The lake's per-table lease** (:mod:`flightstore.lake.lease`) is still taken, under one holder
  name for the whole cluster (``cluster:<cluster id>``): the server that takes over tiers at
  once instead of waiting for the dead server's lake lease to run out, while a Spark tiering job
  (another holder) keeps the cluster off the tables it tiers, and the other way round.
* **Reads through the cluster**: the tierer reads each bucket's committed changelog (below the
  high watermark) at the bucket's leader, wherever that is
  (:class:`~flightstore.lake.cluster_source.ClusterSource` over a
  :class:`~flightstore.cluster.table.ClusterTable`), so a round covers every bucket of the table.
* **Every server follows the lake's commits** (the tierer's follow mode): it reads each
  datalake-enabled table's committed offsets and hands them to its own replicas, leaders and
  followers alike, as their retention floor: TTL deletes tiered segments everywhere and never an
  untiered record.
* **One lake per cluster**: every server must name the same catalog and warehouse explicitly
  (the embedded default lives in one server's data directory, which the others cannot reach).
  The first server records a fingerprint of them (no credentials) under ``<root>/lake/settings``;
  a server whose lake differs, or that has none while the cluster has one, refuses to start
  (:func:`check_cluster_lake`).
* **Status through any server**: the tierer's status (last error, failures, upkeep) lives on the
  holder; the others ask it (a peer call), and answer from the lake alone while no server holds
  the lease (during a failover).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from pyarrow import flight

from flightstore.cluster.layout import decode, encode
from flightstore.errors import InvalidOption, TieringLeaseHeld
from flightstore.lake.settings import LakeSettings
from flightstore.lake.status import TableStatus
from flightstore.server import tickets
from flightstore.server.auth import CALLER_TOKEN

__all__ = ["ClusterLake", "check_cluster_lake", "cluster_lake_settings"]

log = logging.getLogger("flightstore.lake")
_ZK_ERRORS = (KazooException, KazooTimeoutError)
_SHARED = ("datalake.iceberg.uri", "datalake.iceberg.warehouse")


def cluster_lake_settings(data_dir: Any, options: Mapping[str, Any]) -> LakeSettings | None:
    """The lake of a cluster member from its server ``options``: None when no ``datalake.*``
    option is given (the cluster has no lake); InvalidOption when some are but the shared catalog
    and warehouse are not both named (the embedded default is one server's own)."""
    given = sorted(key for key, value in options.items() if key.startswith("datalake.") and value is not None)
    if not given:
        return None
    missing = [key for key in _SHARED if options.get(key) is None]
    if missing:
        raise InvalidOption(
            f"option(s) {', '.join(given)} need a lake every server of the cluster shares: set "
            f"{' and '.join(missing)} on every server (the embedded default lake is one server's own)")
    return LakeSettings.from_options(data_dir, options)


def _redacted(uri: str) -> str:
    try:
        from sqlalchemy.engine import make_url
        return make_url(uri).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL: show its scheme only
        return uri.split("://", 1)[0] + "://..."


def _fingerprint(settings: LakeSettings) -> str:
    """What names the lake: format, catalog, warehouse and object storage endpoint (hashed: a
    password in the catalog URI never reaches ZooKeeper)."""
    named = [settings.format, settings.catalog_uri, settings.warehouse,
             settings.catalog_properties.get("s3.endpoint", "")]
    return hashlib.sha256("\n".join(named).encode()).hexdigest()


def check_cluster_lake(member: Any, settings: LakeSettings | None) -> None:
    """Refuse (InvalidOption) a server whose lake is not the cluster's: the first server with a
    lake records its fingerprint; every other server must have the same one, and a server with
    no lake may not join a cluster that has one."""
    path = member.paths.lake_settings
    client = member.client
    if settings is not None:
        record = {"fingerprint": _fingerprint(settings), "catalog": _redacted(settings.catalog_uri),
                  "warehouse": settings.warehouse, "server_id": member.server_id}
        try:
            client.create(path, encode(record), makepath=True)
            return
        except NodeExistsError:
            pass
    try:
        existing = decode(client.get(path)[0])
    except NoNodeError:
        return  # no lake in the cluster, none here
    if settings is None:
        raise InvalidOption(
            f"this cluster's lake is catalog {existing['catalog']}, warehouse {existing['warehouse']}: start "
            "every server with the same datalake.iceberg.uri and datalake.iceberg.warehouse")
    if existing["fingerprint"] != _fingerprint(settings):
        raise InvalidOption(
            f"this server's lake (catalog {_redacted(settings.catalog_uri)}, warehouse {settings.warehouse}) "
            f"is not the cluster's (catalog {existing['catalog']}, warehouse {existing['warehouse']}, first "
            f"recorded by server {existing.get('server_id')}): every server must name the same lake")


class ClusterLake:
    """The cluster side of one server's :class:`~flightstore.lake.tierer.LakeTierer`: the tiering
    lease in ZooKeeper and the way to the holder's status. See the module docstring."""

    def __init__(self, member: Any, peers: Any) -> None:
        self.member = member
        self.peers = peers
        self.path = member.paths.lake_tierer
        cluster_id = member.view().cluster_id or member.paths.root
        self.holder = f"cluster:{cluster_id}"  # the lake lease's holder: the same on every server

    def _mine(self, stat: Any) -> bool:
        session = self.member.client.client_id
        return session is not None and stat.ephemeralOwner == session[0]

    def holds(self) -> bool:
        """Whether this server holds the tiering lease now, taking it when it is free. A lost
        ZooKeeper connection answers False (a server that cannot see ZooKeeper does not tier)."""
        client = self.member.client
        try:
            try:
                _, stat = client.get(self.path)
            except NoNodeError:
                info = {"server_id": self.member.server_id, "uri": self.member.config.advertised_uri}
                try:
                    client.create(self.path, encode(info), ephemeral=True, makepath=True)
                    log.info("server %d took the cluster's lake tiering lease", self.member.server_id)
                except NodeExistsError:
                    pass
                _, stat = client.get(self.path)
            return self._mine(stat)
        except (NoNodeError, *_ZK_ERRORS):
            return False

    def holds_now(self) -> bool:
        """Whether this server holds the lease now (never takes it)."""
        try:
            _, stat = self.member.client.get(self.path)
        except (NoNodeError, *_ZK_ERRORS):
            return False
        return self._mine(stat)

    def check_held(self) -> None:
        """Raise :class:`TieringLeaseHeld` unless this server still holds the lease (checked
        right before each commit; never takes it)."""
        try:
            data, stat = self.member.client.get(self.path)
        except (NoNodeError, *_ZK_ERRORS) as exc:
            raise TieringLeaseHeld(f"this server lost the cluster's tiering lease ({type(exc).__name__})") from None
        if not self._mine(stat):
            raise TieringLeaseHeld(f"the cluster's tiering lease moved to server {decode(data).get('server_id')}")

    def current(self) -> dict[str, Any] | None:
        """The holder's ``{"server_id", "uri"}`` (None: nobody holds it now, or ZooKeeper is out
        of reach)."""
        try:
            return decode(self.member.client.get(self.path)[0])
        except (NoNodeError, *_ZK_ERRORS):
            return None

    def describe(self) -> str | None:
        """The holder, as ``t$lake$status`` names the tierer."""
        current = self.current()
        return None if current is None else f"server {current['server_id']} at {current['uri']}"

    def release(self) -> None:
        """Give the lease up if held (at shutdown: another server takes over at once)."""
        client = self.member.client
        try:
            _, stat = client.get(self.path)
            if self._mine(stat):
                client.delete(self.path, version=stat.version)
        except (NoNodeError, *_ZK_ERRORS):
            pass

    def holder_status(self, table: str) -> TableStatus | None:
        """The holder's status of ``table`` (a peer call with the caller's token); None when this
        server holds the lease, nobody does, or the holder does not answer."""
        current = self.current()
        if current is None or int(current["server_id"]) == self.member.server_id:
            return None
        body = tickets.encode_custom({"op": "flightstore.lake-status", "table": table, "peer": True})
        try:
            results = list(self.peers.client(current["uri"]).do_action(
                flight.Action("flightstore.lake-status", body), self.peers.options(CALLER_TOKEN.get())))
        except (flight.FlightUnavailableError, flight.FlightTimedOutError) as exc:
            log.info("the tierer (server %s) did not answer a status request: %s", current["server_id"], exc)
            return None
        answer = tickets.decode_custom(results[0].body.to_pybytes())
        return TableStatus.from_dict(answer["tables"][0])
