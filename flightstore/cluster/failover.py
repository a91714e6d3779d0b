"""Leader election and ISR changes of a bucket (pure decisions; the coordinator and the leaders
write them to ZooKeeper with compare-and-set).

* :func:`elect`: the coordinator's answer to a change of live servers. A bucket whose leader died
  gets the first live member of its in-sync replicas, in replica order, with the leader epoch
  bumped; a dead follower leaves the ISR at once (the leader would otherwise wait for it for
  ``log.replica.max-lag-time`` before acknowledging anything). With no live in-sync replica the
  bucket keeps its dead leader (unavailable, naming it) unless unclean election is allowed, which
  takes any live replica and may lose acknowledged writes.
* :func:`with_isr`: a leader's own change of its ISR, valid only while ZooKeeper still names it
  leader at its epoch.
* :func:`move_off`: replacing a dead (or decommissioned) server's replicas by live servers, one
  step at a time (add a replica, let it catch up, drop the old one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from flightstore.cluster.view import BucketAssignment

__all__ = ["add_replica", "drop_replica", "elect", "move_off", "resign", "with_isr"]


def elect(bucket: BucketAssignment, live: Collection[int], *, unclean: bool = False,
          avoid: Collection[int] = ()) -> BucketAssignment:
    """The bucket's assignment once ``live`` are the live servers (unchanged when nothing moves).
    ``avoid``: servers that should not lead (being decommissioned) while another in-sync one can."""
    isr = tuple(r for r in bucket.isr if r in live)
    if bucket.leader in live and bucket.leader not in avoid:
        if isr == bucket.isr:
            return bucket
        return replace(bucket, isr=isr if bucket.leader in isr else (bucket.leader,) + isr)
    candidates = [r for r in bucket.replicas if r in isr and r not in avoid]
    if not candidates and bucket.leader in live:
        return replace(bucket, isr=isr) if isr != bucket.isr else bucket  # keep the avoided leader
    if not candidates:
        candidates = [r for r in bucket.replicas if r in isr]
    if candidates:
        return BucketAssignment(leader=candidates[0], leader_epoch=bucket.leader_epoch + 1,
                                replicas=bucket.replicas, isr=isr)
    if unclean:
        alive = [r for r in bucket.replicas if r in live]
        if alive:
            return BucketAssignment(leader=alive[0], leader_epoch=bucket.leader_epoch + 1,
                                    replicas=bucket.replicas, isr=(alive[0],))
    # No one to elect: the bucket stays with its dead leader (reads and writes answer UNAVAILABLE
    # naming it) and its ISR, so the first in-sync replica to come back leads again.
    return bucket


def resign(bucket: BucketAssignment, server: int) -> BucketAssignment:
    """The bucket once ``server`` lost its copy: out of the ISR; a leader it was becomes none
    (-1, epoch bumped) for the coordinator to replace from the remaining in-sync replicas."""
    if server not in bucket.replicas or (server not in bucket.isr and bucket.leader != server):
        return bucket
    isr = tuple(r for r in bucket.isr if r != server)
    if bucket.leader == server:
        return BucketAssignment(leader=-1, leader_epoch=bucket.leader_epoch + 1, replicas=bucket.replicas,
                                isr=isr)
    return replace(bucket, isr=isr)


def with_isr(bucket: BucketAssignment, leader: int, epoch: int, isr: Sequence[int]) -> BucketAssignment | None:
    """``bucket`` with ``isr``, if ``leader`` still leads it at ``epoch`` (None: deposed)."""
    if bucket.leader != leader or bucket.leader_epoch != epoch:
        return None
    ordered = tuple(r for r in bucket.replicas if r in set(isr))
    if leader not in ordered:
        ordered = (leader,) + ordered
    return replace(bucket, isr=ordered)


def add_replica(bucket: BucketAssignment, live: Collection[int],
                load: Mapping[int, int]) -> BucketAssignment | None:
    """The bucket with one more replica, on the live server holding the fewest replicas
    (``load``) that holds none of this bucket; None when no server can take one. It joins out of
    sync and enters the ISR once caught up (its leader decides)."""
    choices = sorted((s for s in live if s not in bucket.replicas), key=lambda s: (load.get(s, 0), s))
    if not choices:
        return None
    return replace(bucket, replicas=bucket.replicas + (choices[0],))


def drop_replica(bucket: BucketAssignment, gone: int) -> BucketAssignment | None:
    """The bucket without server ``gone``'s replica, once another in-sync replica exists to keep
    (or take) the lead; None while none does."""
    others = [r for r in bucket.replicas if r != gone and r in bucket.isr]
    if not others:
        return None
    replicas = tuple(r for r in bucket.replicas if r != gone)
    isr = tuple(r for r in bucket.isr if r != gone)
    if bucket.leader == gone:
        return BucketAssignment(leader=others[0], leader_epoch=bucket.leader_epoch + 1, replicas=replicas, isr=isr)
    return replace(bucket, replicas=replicas, isr=isr)


def move_off(bucket: BucketAssignment, gone: int, replication_factor: int, live: Collection[int],
             load: Mapping[int, int]) -> BucketAssignment:
    """One step of moving a bucket's replica off server ``gone`` (dead past the timeout, or
    decommissioned): first a replacement replica is added; once it is in sync, ``gone``'s goes."""
    if gone not in bucket.replicas:
        return bucket
    staying = [r for r in bucket.replicas if r != gone]
    if len(staying) < replication_factor:
        added = add_replica(bucket, live, load)
        return bucket if added is None else added
    if all(r in bucket.isr for r in staying):
        dropped = drop_replica(bucket, gone)
        return bucket if dropped is None else dropped
    return bucket
