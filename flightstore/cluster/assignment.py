"""Bucket assignment: which live server leads each bucket of a new table (pure, no I/O).

Round-robin over the live servers in id order, continuing where the previous table stopped (the
coordinator keeps the count of buckets ever assigned), so small tables spread over the cluster
instead of all starting on the lowest id. As in Fluss, a table keeps its assignment when a server
dies: the bucket is unavailable until its leader is back (failover to a replica comes with
replication; the record already has a leader epoch and a replica list for it).
"""

from __future__ import annotations

from collections.abc import Sequence

from flightstore.cluster.view import BucketAssignment
from flightstore.errors import Unavailable

__all__ = ["round_robin"]


def round_robin(num_buckets: int, live_servers: Sequence[int], start: int = 0) -> tuple[BucketAssignment, ...]:
    """Leaders for ``num_buckets`` buckets over ``live_servers``, beginning at position ``start``."""
    servers = sorted(set(live_servers))
    if not servers:
        raise Unavailable("no live server to assign buckets to")
    return tuple(BucketAssignment(leader=servers[(start + bucket) % len(servers)], leader_epoch=0,
                                  replicas=(servers[(start + bucket) % len(servers)],))
                 for bucket in range(num_buckets))
