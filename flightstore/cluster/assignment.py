"""Bucket assignment: which live servers hold each bucket of a new table, and which leads (pure).

Replicas go round-robin over the live servers in id order, continuing where the previous table
stopped (the coordinator keeps the count of buckets ever assigned): bucket *b*'s replicas are the
``replication_factor`` servers from position ``start + b``, on distinct servers, and its first
replica leads, so leaders spread evenly too. A new bucket's replicas are all in sync (its log is
empty everywhere). When a server dies its buckets keep their replicas and move leadership to a live
in-sync one (:mod:`flightstore.cluster.failover`).
"""

from __future__ import annotations

from collections.abc import Sequence

from flightstore.cluster.view import BucketAssignment
from flightstore.errors import InvalidInput, Unavailable

__all__ = ["round_robin"]


def round_robin(num_buckets: int, live_servers: Sequence[int], start: int = 0,
                replication_factor: int = 1) -> tuple[BucketAssignment, ...]:
    """Replicas and leaders for ``num_buckets`` buckets over ``live_servers``, from ``start``."""
    servers = sorted(set(live_servers))
    if not servers:
        raise Unavailable("no live server to assign buckets to")
    if replication_factor > len(servers):
        raise InvalidInput(f"replication factor {replication_factor} is more than the {len(servers)} live "
                           f"server(s) ({', '.join(map(str, servers))}): each replica needs its own server")
    out = []
    for bucket in range(num_buckets):
        replicas = tuple(servers[(start + bucket + i) % len(servers)] for i in range(replication_factor))
        out.append(BucketAssignment(leader=replicas[0], leader_epoch=0, replicas=replicas, isr=replicas))
    return tuple(out)
