"""A table's upkeep tasks as one call: what a client asks through any server (``flightstore.undo``,
``.release``, ``.snapshot``, ``.usage``, ``.expire-writers``) and what a cluster's bucket leaders
run for the server that was asked.

:func:`run_task` runs one task on a table held here, limited to ``buckets`` (numbers within a
partition: the buckets a leader leads; a follower replica only ever takes what its leader's log
says) where the task touches buckets, and answers plain JSON-able values (they travel between
servers). :meth:`TableApi.run_upkeep <flightstore.table.api.TableApi.run_upkeep>` runs it here; a
:class:`~flightstore.cluster.table.ClusterTable` runs it on every leader of the table and answers
each server's result, so a client learns which server did what.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flightstore.acl import Operation
from flightstore.errors import InvalidInput

__all__ = ["TASKS", "SnapshotSummary", "merged", "run_task"]

#: Each task and the operation a caller needs on the table (as for the client-facing action).
TASKS: dict[str, Operation] = {
    "undo": Operation.WRITE,
    "release": Operation.WRITE,
    "snapshot": Operation.ALTER,
    "retention": Operation.ALTER,
    "usage": Operation.DESCRIBE,
    "expire_writers": Operation.ALTER,
}


@dataclass(frozen=True)
class SnapshotSummary:
    """What a server tells of a KV snapshot it took (a cluster table's ``snapshot()`` answers
    these: the files stay on their server)."""

    id: int
    offset: int
    rows: int
    created_ms: int


def run_task(table: Any, task: str, args: Mapping[str, Any], buckets: Sequence[int] | None = None) -> Any:
    """Run upkeep ``task`` with ``args`` on ``table`` (a table held here: Table or
    PartitionedTable), only on ``buckets`` where the task is per bucket; the answer as JSON."""
    if task == "undo":
        return int(table.undo(str(args["writer_id"]), int(args["after_sequence"]), buckets=buckets))
    if task == "release":
        table.release(str(args["writer_id"]))
        return None
    if task == "snapshot":
        taken = table.snapshot(force=bool(args.get("force", False)), buckets=buckets)
        return {str(bucket): None if info is None else {"id": info.id, "offset": info.offset, "rows": info.rows,
                                                        "created_ms": info.created_ms}
                for bucket, info in taken.items()}
    if task == "retention":
        return int(table.enforce_retention())
    if task == "usage":
        return dict(table.disk_usage(buckets))
    if task == "expire_writers":
        return sorted(table.expire_writers())
    raise InvalidInput(f"unknown upkeep task {task!r}; tasks are {', '.join(TASKS)}")


def merged(task: str, answers: Mapping[Any, Any]) -> Any:
    """The table-wide answer of ``task`` from each server's (sums, unions)."""
    values = list(answers.values())
    if task in ("undo", "retention"):
        return sum(values)
    if task == "release":
        return None
    if task == "snapshot":
        return {bucket: info for value in values for bucket, info in value.items()}
    if task == "usage":
        total: dict[str, int] = {}
        for value in values:
            for key, count in value.items():
                total[key] = total.get(key, 0) + count
        return total or {"kv": 0, "snapshots": 0, "log": 0, "total": 0}
    if task == "expire_writers":
        return sorted({writer for value in values for writer in value})
    raise InvalidInput(f"unknown upkeep task {task!r}")
