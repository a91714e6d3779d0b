"""Leader election and replica moves (pure decisions of the coordinator and the leaders)."""

from flightstore.cluster.failover import elect, move_off, resign, with_isr
from flightstore.cluster.view import BucketAssignment


def _b(leader, epoch, replicas, isr):
    return BucketAssignment(leader=leader, leader_epoch=epoch, replicas=tuple(replicas), isr=tuple(isr))


def test_a_dead_leader_is_replaced_by_the_first_live_in_sync_replica():
    bucket = _b(1, 3, [1, 2, 3], [1, 3])
    assert elect(bucket, {2, 3}) == _b(3, 4, [1, 2, 3], [3])  # 2 is alive but out of sync


def test_a_dead_follower_leaves_the_isr_without_an_election():
    assert elect(_b(1, 3, [1, 2, 3], [1, 2, 3]), {1, 3}) == _b(1, 3, [1, 2, 3], [1, 3])
    assert elect(_b(1, 3, [1, 2, 3], [1, 2, 3]), {1, 2, 3}) == _b(1, 3, [1, 2, 3], [1, 2, 3])


def test_no_live_in_sync_replica_keeps_the_dead_leader_unless_unclean():
    bucket = _b(1, 3, [1, 2, 3], [1])
    assert elect(bucket, {2, 3}) == bucket  # unavailable, naming server 1, until it is back
    assert elect(bucket, {2, 3}, unclean=True) == _b(2, 4, [1, 2, 3], [2])
    resigned = resign(_b(1, 3, [1, 2, 3], [1, 2]), 1)  # server 1 came back with an empty disk
    assert resigned == _b(-1, 4, [1, 2, 3], [2])
    assert elect(resigned, {1, 2, 3}) == _b(2, 5, [1, 2, 3], [2])
    assert elect(resign(_b(1, 0, [1], [1]), 1), {1}).leader == -1  # nobody holds the data: unavailable


def test_an_avoided_leader_hands_over_to_another_in_sync_replica():
    assert elect(_b(1, 0, [1, 2], [1, 2]), {1, 2}, avoid={1}) == _b(2, 1, [1, 2], [1, 2])
    assert elect(_b(1, 0, [1, 2], [1]), {1, 2}, avoid={1}) == _b(1, 0, [1, 2], [1])


def test_an_isr_change_needs_the_leader_at_its_epoch():
    bucket = _b(1, 3, [1, 2, 3], [1, 2, 3])
    assert with_isr(bucket, 1, 3, [3, 1]) == _b(1, 3, [1, 2, 3], [1, 3])
    assert with_isr(bucket, 1, 2, [1]) is None
    assert with_isr(bucket, 2, 3, [2]) is None


def test_moving_a_replica_adds_one_then_drops_the_old_once_in_sync():
    bucket = _b(1, 2, [1, 2, 3], [1, 2])
    step = move_off(bucket, 3, 3, {1, 2, 4, 5}, {4: 7, 5: 1})
    assert step == _b(1, 2, [1, 2, 3, 5], [1, 2])
    assert move_off(step, 3, 3, {1, 2, 4, 5}, {}) == step  # 5 not in sync yet
    done = move_off(_b(1, 2, [1, 2, 3, 5], [1, 2, 5]), 3, 3, {1, 2, 4, 5}, {})
    assert done == _b(1, 2, [1, 2, 5], [1, 2, 5])
    leading = move_off(_b(3, 2, [3, 1, 5], [3, 1, 5]), 3, 2, {1, 3, 5}, {})
    assert leading == _b(1, 3, [1, 5], [1, 5])
