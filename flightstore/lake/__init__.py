"""The lake tier: tables tiered from the log into Apache Iceberg (pyiceberg), read back by any engine.

Modules, in the order data flows:

* :mod:`~flightstore.lake.settings` - where the lake lives (catalog URI, warehouse, S3) and tiering
  options, resolved from the server options;
* :mod:`~flightstore.lake.catalog` - the Iceberg SQL catalog and one lake table per table;
* :mod:`~flightstore.lake.layout` - the lake table's schema, partition spec (bucket-aligned) and rows;
* :mod:`~flightstore.lake.offsets` - tiered offsets in the snapshot summaries;
* :mod:`~flightstore.lake.changes` - primary-key changelogs folded and applied bucket-aligned;
* :mod:`~flightstore.lake.drops` - rows of dropped partitions deleted from the lake;
* :mod:`~flightstore.lake.tiering` - one crash-safe tiering round;
* :mod:`~flightstore.lake.remote` - a table read through Flight (the Spark tiering job's source);
* :mod:`~flightstore.lake.lease` - at most one tierer per table;
* :mod:`~flightstore.lake.tierer` - the server's background tierer (freshness, backoff, retention);
* :mod:`~flightstore.lake.cluster` - cluster mode: one tierer for the cluster under a ZooKeeper
  lease, one lake for every server; :mod:`~flightstore.lake.cluster_source` - a round's reads of
  a cluster table, each bucket at its leader;
* :mod:`~flightstore.lake.upkeep` - snapshot expiry and orphan files, after the tierer's rounds;
* :mod:`~flightstore.lake.status` - lag per table and bucket;
* :mod:`~flightstore.lake.read` - reading the lake (time travel, pruning, filters);
* :mod:`~flightstore.lake.union` - the union read: lake below the tiered offsets + the log tail.
"""

import importlib
from typing import Any

# Names are loaded on first use (PEP 562): importing flightstore.lake.layout (the SQL planner does)
# must not load pyiceberg's catalog and SQLAlchemy into every server process.
_HOMES = {
    "LakeCatalog": "flightstore.lake.catalog",
    "BUCKET_COLUMN": "flightstore.lake.layout",
    "META_COLUMNS": "flightstore.lake.layout",
    "OFFSET_COLUMN": "flightstore.lake.layout",
    "TIMESTAMP_COLUMN": "flightstore.lake.layout",
    "Lease": "flightstore.lake.lease",
    "LeaseStore": "flightstore.lake.lease",
    "LakeSnapshot": "flightstore.lake.read",
    "lake_snapshots": "flightstore.lake.read",
    "plan_lake_files": "flightstore.lake.read",
    "read_lake": "flightstore.lake.read",
    "LakeSettings": "flightstore.lake.settings",
    "BucketStatus": "flightstore.lake.status",
    "TableStatus": "flightstore.lake.status",
    "LakeTierer": "flightstore.lake.tierer",
    "RoundResult": "flightstore.lake.tiering",
    "tier_log_round": "flightstore.lake.tiering",
    "tier_round": "flightstore.lake.tiering",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'flightstore.lake' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "BUCKET_COLUMN",
    "META_COLUMNS",
    "OFFSET_COLUMN",
    "TIMESTAMP_COLUMN",
    "BucketStatus",
    "LakeCatalog",
    "LakeSettings",
    "LakeSnapshot",
    "LakeTierer",
    "Lease",
    "LeaseStore",
    "RoundResult",
    "TableStatus",
    "lake_snapshots",
    "plan_lake_files",
    "read_lake",
    "tier_log_round",
    "tier_round",
]
