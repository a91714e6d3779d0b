"""The catalog of a group of workers, held by worker 0: databases, tables and their ids, versioned.

It plays the part ZooKeeper and the coordinator play in a cluster (:mod:`flightstore.cluster.coordinator`),
for one machine: the same operations with the same refusals (the single server's errors), a version
bumped by every change, and one file, ``<data-dir>/workers.json``, rewritten atomically before a
change is announced (so a worker 0 restarted after a crash announces what it had committed, never
less). Buckets are not stored: bucket *b* of every table is led by worker ``b % workers``
(:func:`assignments`), so the number of workers of a data directory is fixed at its first start.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from flightstore.alter import PartitionLimits, apply_changes, change_from_json
from flightstore.catalog import DEFAULT_DATABASE
from flightstore.cluster.view import BucketAssignment, ClusterView, ServerInfo, TableRecord
from flightstore.errors import AlreadyExists, DatabaseNotFound, InvalidInput, TableNotFound
from flightstore.names import check_name
from flightstore.schema import TableDescriptor, TablePath
from flightstore.store import new_table_descriptor

__all__ = ["CATALOG_FILE", "WorkerCatalog", "assignments", "view_from_json", "view_to_json"]

CATALOG_FILE = "workers.json"


def assignments(num_buckets: int, workers: int) -> tuple[BucketAssignment, ...]:
    """Bucket ``b`` led (alone: replication factor 1) by worker ``b % workers``."""
    return tuple(BucketAssignment(leader=b % workers, leader_epoch=0, replicas=(b % workers,),
                                  isr=(b % workers,)) for b in range(num_buckets))


class WorkerCatalog:
    """The catalog of ``data_dir``'s workers (worker 0's; see the module docstring)."""

    def __init__(self, data_dir: str | os.PathLike, workers: int, limits: PartitionLimits | None = None) -> None:
        self.file = Path(data_dir) / CATALOG_FILE
        self.workers = workers
        self.limits = limits or PartitionLimits()
        self._lock = threading.Lock()
        if self.file.exists():
            state = json.loads(self.file.read_text(encoding="utf-8"))
            if int(state["workers"]) != workers:
                raise InvalidInput(
                    f"data directory {data_dir} was served with --workers {state['workers']}: its buckets "
                    f"live where that many workers put them; serve it with --workers {state['workers']}")
        else:
            state = {"cluster_id": uuid.uuid4().hex, "workers": workers, "version": 1,
                     "databases": [DEFAULT_DATABASE], "tables": {}}
            self._save(state)
        self._state = state

    @property
    def cluster_id(self) -> str:
        return self._state["cluster_id"]

    @property
    def version(self) -> int:
        return int(self._state["version"])

    def state(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.file)

    # ---- DDL ----------------------------------------------------------------------------------
    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        """Apply one DDL request (the ops of :mod:`flightstore.cluster.ddl`); the answer carries
        the catalog ``version`` holding it. Refusals raise the single server's errors."""
        with self._lock:
            state = json.loads(json.dumps(self._state))  # a copy: a refusal changes nothing
            op = request.get("op")
            handler = {"create_database": self._create_database, "drop_database": self._drop_database,
                       "create_table": self._create_table, "drop_table": self._drop_table,
                       "alter_table": self._alter_table}.get(str(op))
            if handler is None:
                raise InvalidInput(f"unknown DDL operation {op!r}")
            result = handler(request, state)
            if result.pop("changed"):
                state["version"] = int(state["version"]) + 1
                self._save(state)
                self._state = state
            return {"ok": True, "version": int(self._state["version"]), "result": result}

    @staticmethod
    def _create_database(request: dict, state: dict) -> dict:
        name = check_name(request["name"], "database")
        if name in state["databases"]:
            if request.get("if_not_exists"):
                return {"changed": False, "created": False}
            raise AlreadyExists(f"database {name!r} already exists")
        state["databases"] = sorted({*state["databases"], name})
        return {"changed": True, "created": True}

    @staticmethod
    def _drop_database(request: dict, state: dict) -> dict:
        name = str(request["name"])
        if name not in state["databases"]:
            if request.get("if_exists"):
                return {"changed": False, "dropped": False}
            raise DatabaseNotFound(f"database {name!r} does not exist")
        tables = [p for p in state["tables"] if TablePath.parse(p).database == name]
        if tables and not request.get("cascade"):
            raise InvalidInput(f"database {name!r} is not empty ({len(tables)} tables); use DROP "
                               f"DATABASE {name} CASCADE")
        for path in tables:
            del state["tables"][path]
        state["databases"] = [d for d in state["databases"] if d != name]
        return {"changed": True, "dropped": True}

    def _create_table(self, request: dict, state: dict) -> dict:
        requested = TableDescriptor.from_json(request["descriptor"])
        descriptor = new_table_descriptor(requested.path, descriptor=requested)
        path = descriptor.path
        if path.database not in state["databases"]:
            raise DatabaseNotFound(f"database {path.database!r} does not exist")
        if str(path) in state["tables"]:
            if request.get("if_not_exists"):
                return {"changed": False, "created": False}
            raise AlreadyExists(f"table {path} already exists")
        self.limits.check_create(descriptor)
        table_id = uuid.uuid4().hex
        state["tables"][str(path)] = {"table_id": table_id, "descriptor": descriptor.with_version(1).to_json()}
        return {"changed": True, "created": True, "table_id": table_id,
                "leaders": [b % self.workers for b in range(descriptor.num_buckets)]}

    @staticmethod
    def _drop_table(request: dict, state: dict) -> dict:
        path = TablePath(request["database"], request["table"])
        if path.database not in state["databases"] or str(path) not in state["tables"]:
            if request.get("if_exists"):
                return {"changed": False, "dropped": False}
            if path.database not in state["databases"]:
                raise DatabaseNotFound(f"database {path.database!r} does not exist")
            raise TableNotFound(f"table {path} does not exist")
        del state["tables"][str(path)]
        return {"changed": True, "dropped": True}

    def _alter_table(self, request: dict, state: dict) -> dict:
        path = TablePath(request["database"], request["table"])
        record = state["tables"].get(str(path))
        if record is None:
            raise TableNotFound(f"table {path} does not exist")
        old = TableDescriptor.from_json(record["descriptor"])
        new = apply_changes(old, [change_from_json(c) for c in request["changes"]], self.limits)
        if new == old:
            return {"changed": False}
        if new.path != path and str(new.path) in state["tables"]:
            raise AlreadyExists(f"table {new.path} already exists")
        del state["tables"][str(path)]
        state["tables"][str(new.path)] = {**record, "descriptor": new.to_json()}  # same id, same buckets
        return {"changed": True}


def view_to_json(state: dict[str, Any], servers: dict[int, ServerInfo], generation: int) -> dict[str, Any]:
    """What worker 0 announces: its catalog ``state``, the live workers and a ``generation`` that
    orders announcements (a worker applies only a newer one)."""
    return {"op": "workers.view", "generation": generation, "workers": state["workers"], "version": state["version"],
            "cluster_id": state["cluster_id"], "databases": list(state["databases"]),
            "tables": state["tables"], "servers": {str(i): s.to_json() for i, s in servers.items()}}


def view_from_json(data: dict[str, Any]) -> ClusterView:
    """The :class:`ClusterView` an announcement describes (coordinator: worker 0)."""
    workers = int(data["workers"])
    tables = {}
    for name, record in data["tables"].items():
        descriptor = TableDescriptor.from_json(record["descriptor"])
        tables[TablePath.parse(name)] = TableRecord(record["table_id"], descriptor,
                                                    assignments(descriptor.num_buckets, workers))
    servers = {int(i): ServerInfo.from_json(s) for i, s in data["servers"].items()}
    return ClusterView(version=int(data["version"]), cluster_id=data["cluster_id"], servers=servers,
                       coordinator=0, databases=frozenset(data["databases"]), tables=tables)
