"""How ``flightstore serve --workers N`` starts: the data directory layout, joining, the children.

Worker 0 serves ``<data-dir>/worker-0`` on the port the user gave and keeps the group's catalog in
``<data-dir>/workers.json``; worker k serves ``<data-dir>/worker-<k>`` on a free port. A data
directory is either a single server's or a group's: each refuses the other, so no table is
silently left behind or served twice.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightstore.cluster.workers.catalog import CATALOG_FILE
from flightstore.cluster.workers.member import WorkerConfig, WorkerMember
from flightstore.cluster.workers.supervisor import CLUSTER_ENV, SECRET_ENV, WorkerSupervisor, watch_parent
from flightstore.errors import InvalidInput

__all__ = ["WorkerLaunch", "check_single_server_dir"]


def check_single_server_dir(data_dir: str | os.PathLike) -> None:
    """Refuse to serve a group's data directory as one server (its tables are in worker-<k>/)."""
    catalog = Path(data_dir) / CATALOG_FILE
    if catalog.exists():
        import json
        workers = json.loads(catalog.read_text(encoding="utf-8")).get("workers")
        raise InvalidInput(f"data directory {data_dir} belongs to {workers} workers (its tables are in "
                           f"worker-<k>/): serve it with --workers {workers}")


@dataclass(frozen=True)
class WorkerLaunch:
    """``workers`` processes; this one is ``worker_id`` (0: the one the user started).
    ``child_args``: the ``serve`` arguments every child shares (host, auth, options...)."""

    workers: int
    worker_id: int = 0
    coordinator_uri: str | None = None
    child_args: tuple[str, ...] = ()
    metrics_port: int | None = None

    def data_dir(self, root: str | os.PathLike) -> Path:
        """This worker's own data directory under ``root`` (checked for worker 0)."""
        if self.worker_id == 0:
            root = Path(root)
            if (root / "catalog.json").exists():
                raise InvalidInput(f"data directory {root} holds a single server's tables: serve it without "
                                   "--workers, or give --workers a new --data-dir")
            root.mkdir(parents=True, exist_ok=True)
            return root / "worker-0"
        return Path(root)  # a child is handed its own directory

    def root(self, data_dir: str | os.PathLike) -> str:
        return str(data_dir if self.worker_id == 0 else Path(data_dir).parent)

    def join(self, store: Any, data_dir: str | os.PathLike, host: str, port: int) -> WorkerMember:
        """Make this process's member and join the group (worker 0: open its catalog)."""
        if self.worker_id == 0:
            secret, cluster_id = secrets.token_bytes(32), None
        else:
            watch_parent()
            if SECRET_ENV not in os.environ or CLUSTER_ENV not in os.environ:
                raise InvalidInput("--worker-of is set by worker 0 for the workers it starts; run "
                                   "`flightstore serve --workers N` instead")
            secret, cluster_id = bytes.fromhex(os.environ[SECRET_ENV]), os.environ[CLUSTER_ENV]
        if host in ("0.0.0.0", "::", ""):
            import socket
            host = socket.gethostname()
        config = WorkerConfig(self.worker_id, self.workers, self.root(data_dir), secret, cluster_id,
                              self.coordinator_uri, f"grpc://{host}:{port}")
        member = WorkerMember(config, store)
        try:
            member.start()
        except BaseException:
            member.stop()
            raise
        return member

    def start_children(self, member: WorkerMember, data_dir: str | os.PathLike) -> WorkerSupervisor:
        """Worker 0: start workers 1..N-1 and return once each serves."""
        root = Path(data_dir)

        def args_of(worker: int) -> list[str]:
            metrics = [] if self.metrics_port is None else \
                ["--metrics-port", str(self.metrics_port + worker if self.metrics_port else 0)]
            return [*self.child_args, "--data-dir", str(root / f"worker-{worker}"), "--port", "0",
                    "--workers", str(self.workers), "--worker-id", str(worker),
                    "--worker-of", member.config.advertised_uri, *metrics]

        supervisor = WorkerSupervisor(member, args_of)
        supervisor.start()
        return supervisor
