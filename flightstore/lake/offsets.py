"""Tiered offsets, recorded in the summary properties of the Iceberg snapshots that commit them.

Every tiering commit writes ``flightstore.tiered-offsets`` = ``{"<bucket>": <offset>, ...}``: the
log offset of each bucket below which the lake holds every row. The property is committed in the
same atomic catalog swap as the data files, so the lake's rows and its offsets can never disagree;
a tierer starts each round from what the last committed snapshot says, which is what makes a
crash anywhere in a round harmless (the round is redone, nothing doubled, nothing skipped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from flightstore.errors import CorruptData

__all__ = [
    "OFFSETS_PROPERTY",
    "TABLE_ID_PROPERTY",
    "committed_offsets",
    "encode_offsets",
    "snapshot_offsets",
    "tiering_snapshots",
]

OFFSETS_PROPERTY = "flightstore.tiered-offsets"
TABLE_ID_PROPERTY = "flightstore.table-id"  # which incarnation of a flightstore table the lake holds


def encode_offsets(offsets: Mapping[int, int]) -> str:
    """The summary property value of per-bucket ``offsets``."""
    return json.dumps({str(bucket): int(offset) for bucket, offset in sorted(offsets.items())})


def snapshot_offsets(snapshot: Snapshot) -> dict[int, int] | None:
    """The tiered offsets a snapshot recorded, or None for a snapshot no tierer wrote."""
    summary = snapshot.summary
    raw = summary.additional_properties.get(OFFSETS_PROPERTY) if summary is not None else None
    if raw is None:
        return None
    try:
        return {int(bucket): int(offset) for bucket, offset in json.loads(raw).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptData(f"snapshot {snapshot.snapshot_id}: unreadable {OFFSETS_PROPERTY} "
                          f"{raw!r}: {exc}") from None


def tiering_snapshots(table: IcebergTable, snapshot: Snapshot | None = None) -> list[Snapshot]:
    """The tiering commits of ``table`` from ``snapshot`` (default: current) back to the first,
    newest first. Snapshots other writers made (compaction, maintenance) are skipped."""
    start = table.current_snapshot() if snapshot is None else snapshot
    return [s for s in ancestors_of(start, table.metadata) if snapshot_offsets(s) is not None]


def committed_offsets(table: IcebergTable, snapshot: Snapshot | None = None) -> dict[int, int]:
    """Per-bucket tiered offsets as of ``snapshot`` (default: the current one); ``{}`` before the
    first tiering commit. Walks back past snapshots that other writers committed."""
    start = table.current_snapshot() if snapshot is None else snapshot
    for ancestor in ancestors_of(start, table.metadata):
        offsets = snapshot_offsets(ancestor)
        if offsets is not None:
            return offsets
    return {}
