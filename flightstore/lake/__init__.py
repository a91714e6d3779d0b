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

from flightstore.lake.catalog import LakeCatalog
from flightstore.lake.layout import BUCKET_COLUMN, META_COLUMNS, OFFSET_COLUMN, TIMESTAMP_COLUMN
from flightstore.lake.lease import Lease, LeaseStore
from flightstore.lake.read import LakeSnapshot, lake_snapshots, plan_lake_files, read_lake
from flightstore.lake.settings import LakeSettings
from flightstore.lake.status import BucketStatus, TableStatus
from flightstore.lake.tierer import LakeTierer
from flightstore.lake.tiering import RoundResult, tier_log_round, tier_round

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
