"""Where the cluster keeps its state in ZooKeeper: the znode layout and its JSON payloads.

Every znode flightstore writes sits under one root: the chroot of ``--zookeeper HOST:PORT/chroot``,
or ``/flightstore`` without one, so several clusters (and tests) share one ZooKeeper::

    <root>/cluster-id                        persistent  {"cluster_id"}: a data directory remembers it
    <root>/secret                            persistent  {"verifier"}: checks the signing secret each
                                                          server derives from its secret file; or,
                                                          keyless, {"secret"} (no users allowed)
    <root>/security/users                    persistent  {"users": {name: Argon2id hash}}: the
                                                          cluster's users (it authenticates once
                                                          this exists)
    <root>/security/grants                   persistent  {"grants": [...]}: the cluster's grants
    <root>/servers/<id>                      ephemeral   ServerInfo: uri, pid, catalog_version and
                                                          the users/grants versions it applied
    <root>/coordinator/election/...          kazoo Election (Lock) contenders
    <root>/coordinator/active                ephemeral   {"id", "uri", "epoch"} of the coordinator
    <root>/coordinator/epoch                 persistent  {"epoch"}; its znode version fences writes
    <root>/metadata/version                  persistent  {"version", "assigned"}: bumped by each DDL
    <root>/metadata/databases/<db>           persistent  {}
    <root>/metadata/databases/<db>/<table>   persistent  {"table_id", "descriptor"}
    <root>/metadata/assignments/<table_id>   persistent  {"path", "replication_factor", "buckets":
                                                          [{leader, leader_epoch, replicas, isr}],
                                                          "coordinator_epoch"}: each bucket's
                                                          LeaderAndIsr, changed by compare-and-set
                                                          (coordinator: elections, moves; leader:
                                                          its ISR), without a catalog version bump
    <root>/metadata/dropped/<table_id>       persistent  {"path"}: the DROP of a table (written with
                                                          it): the only thing that lets a server
                                                          delete a table's data
    <root>/decommissioned/<id>               persistent  a server whose replicas move away
    <root>/lake/settings                     persistent  {"fingerprint", "catalog", "warehouse"}: the
                                                          lake every server must use (no secrets)
    <root>/lake/tierer                       ephemeral   {"server_id", "uri"}: the server that tiers
                                                          (flightstore.lake.cluster)
    <root>/ddl/requests/r-<seq>              persistent sequential: a DDL request
    <root>/ddl/responses/r-<seq>             persistent  its answer, read and deleted by the requester

Payloads are UTF-8 JSON objects (:func:`encode` / :func:`decode`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flightstore.errors import InvalidInput

__all__ = ["ZkAddress", "ZkPaths", "decode", "encode"]

_HOST_PORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


@dataclass(frozen=True)
class ZkAddress:
    """A parsed ``HOST:PORT[,HOST:PORT...][/chroot]``: the ensemble to connect to and the root."""

    hosts: str
    root: str

    @classmethod
    def parse(cls, text: str) -> ZkAddress:
        text = str(text).strip()
        hosts, slash, chroot = text.partition("/")
        if not hosts or not all(_HOST_PORT.match(part) for part in hosts.split(",")):
            raise InvalidInput(f"--zookeeper expects HOST:PORT[,HOST:PORT...][/chroot], got {text!r}")
        root = "/" + chroot.strip("/") if slash and chroot.strip("/") else "/flightstore"
        if "//" in root or any(part in (".", "..") for part in root.split("/")):
            raise InvalidInput(f"invalid ZooKeeper chroot {root!r}")
        return cls(hosts, root)

    def __str__(self) -> str:
        return f"{self.hosts}{self.root}"


@dataclass(frozen=True)
class ZkPaths:
    """The znode paths of one cluster root."""

    root: str

    @property
    def cluster_id(self) -> str:
        return f"{self.root}/cluster-id"

    @property
    def secret(self) -> str:
        return f"{self.root}/secret"

    @property
    def security(self) -> str:
        return f"{self.root}/security"

    @property
    def users(self) -> str:
        return f"{self.security}/users"

    @property
    def grants(self) -> str:
        return f"{self.security}/grants"

    @property
    def servers(self) -> str:
        return f"{self.root}/servers"

    def server(self, server_id: int) -> str:
        return f"{self.servers}/{server_id}"

    @property
    def election(self) -> str:
        return f"{self.root}/coordinator/election"

    @property
    def active_coordinator(self) -> str:
        return f"{self.root}/coordinator/active"

    @property
    def coordinator_epoch(self) -> str:
        return f"{self.root}/coordinator/epoch"

    @property
    def version(self) -> str:
        return f"{self.root}/metadata/version"

    @property
    def databases(self) -> str:
        return f"{self.root}/metadata/databases"

    def database(self, name: str) -> str:
        return f"{self.databases}/{name}"

    def table(self, database: str, table: str) -> str:
        return f"{self.databases}/{database}/{table}"

    @property
    def assignments(self) -> str:
        return f"{self.root}/metadata/assignments"

    def assignment(self, table_id: str) -> str:
        return f"{self.assignments}/{table_id}"

    @property
    def dropped(self) -> str:
        return f"{self.root}/metadata/dropped"

    def dropped_table(self, table_id: str) -> str:
        return f"{self.dropped}/{table_id}"

    @property
    def decommissioned(self) -> str:
        return f"{self.root}/decommissioned"

    def decommission(self, server_id: int) -> str:
        return f"{self.decommissioned}/{server_id}"

    @property
    def lake(self) -> str:
        return f"{self.root}/lake"

    @property
    def lake_settings(self) -> str:
        return f"{self.lake}/settings"

    @property
    def lake_tierer(self) -> str:
        return f"{self.lake}/tierer"

    @property
    def requests(self) -> str:
        return f"{self.root}/ddl/requests"

    @property
    def responses(self) -> str:
        return f"{self.root}/ddl/responses"

    def response(self, request_name: str) -> str:
        return f"{self.responses}/{request_name}"

    def persistent_parents(self) -> list[str]:
        """The parents every member makes sure exist before using the layout."""
        return [self.servers, self.election, self.databases, self.assignments, self.dropped, self.requests,
                self.responses, self.decommissioned, self.lake]


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes | None) -> dict[str, Any]:
    """The JSON object in ``data``; an empty dict for an empty or missing payload."""
    if not data:
        return {}
    return json.loads(data.decode())
