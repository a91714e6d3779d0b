"""A leader deposed while it waits for a write (or a read) to be committed: its uncommitted tail is
cut and the new leader's records take the same offsets, so the high watermark passes them. The
write must not be acknowledged and the read must not answer (found by the Jepsen-style test,
seed 1: a SIGSTOPped leader resumed, appended two queued writes, became a follower, truncated them,
and acknowledged them once the new leader's records covered their offsets)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pyarrow as pa
import pytest

from flightstore.errors import NotEnoughReplicas, NotLeader
from flightstore.log import LogTablet
from flightstore.replica.replica import Leadership, Replica
from flightstore.store import Store

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _lead(me: int, leader: int, epoch: int, timeout: float = 30) -> Leadership:
    return Leadership(me=me, leader=leader, epoch=epoch, replicas=(1, 2), isr=(1, 2), min_isr=1,
                      replicated=True, commit_timeout_s=timeout)


def _rows(n: int, first: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


def _in_thread(call) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            call()
            outcome.append("returned")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _depose(replica: Replica, new_leader_log: LogTablet) -> None:
    """What the fetcher does when server 2 leads at epoch 1: truncate where the logs diverge, then
    append the new leader's records (epoch 1) with its high watermark."""
    replica.become_follower(_lead(1, 2, 1))
    replica.truncate(replica.truncation_point(0, 0))
    records = new_leader_log.read_raw(0, 1 << 20)
    replica.append_fetched(records, [1] * len(records), new_leader_log.end_offset)


def test_a_write_cut_from_a_deposed_leaders_log_is_not_acknowledged(tmp_path):
    replica = Replica(LogTablet(tmp_path / "old", SCHEMA, fsync=False), None, 0, fsync=False)
    replica.become_leader(_lead(1, 1, 0))
    log = replica.log
    cuts = log.truncations
    log.append(_rows(3))  # the write, at offsets 0..2 of epoch 0; follower 2 never fetches it
    thread, outcome = _in_thread(lambda: replica.await_commit(log.end_offset, cuts))
    new_leader = LogTablet(tmp_path / "new", SCHEMA, fsync=False)
    new_leader.append(_rows(5, 100))  # server 2's own records at offsets 0..4
    _depose(replica, new_leader)
    thread.join(30)
    assert log.high_watermark == 5 and [r["k"] for b in log.read(0) for r in b.batch.to_pylist()] == \
        list(range(100, 105))  # the write is gone; the high watermark covers its offsets
    assert len(outcome) == 1 and isinstance(outcome[0], NotLeader), outcome


def test_a_committed_write_is_acknowledged_even_if_the_leader_moves_on(tmp_path):
    replica = Replica(LogTablet(tmp_path / "old", SCHEMA, fsync=False), None, 0, fsync=False)
    replica.become_leader(_lead(1, 1, 0))
    cuts = replica.log.truncations
    replica.log.append(_rows(3))
    replica.fetched(2, 3)  # follower 2 has it: committed
    replica.become_follower(_lead(1, 2, 1))
    replica.truncate(3)  # the new leader's log agrees up to 3: nothing cut
    replica.await_commit(3, cuts)


def test_a_write_whose_in_sync_replicas_shrank_below_the_minimum_is_not_acknowledged(tmp_path):
    """CI: the coordinator dropped a dead follower from the ISR after the leader checked the write
    (two in sync, min-in-sync 2): the new ISR (the leader alone) let the high watermark pass the
    write with one copy. Not acknowledged (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
    replica = Replica(LogTablet(tmp_path / "log", SCHEMA, fsync=False), None, 0, fsync=False)
    two = Leadership(me=1, leader=1, epoch=0, replicas=(1, 2), isr=(1, 2), min_isr=2, replicated=True,
                     commit_timeout_s=30)
    replica.become_leader(two)
    replica.check_writable()
    cuts = replica.log.truncations
    replica.log.append(_rows(3))
    thread, outcome = _in_thread(lambda: replica.await_commit(3, cuts))
    replica.update(replace(two, isr=(1,)))  # follower 2 dropped: the HW passes
    thread.join(30)
    assert replica.log.high_watermark == 3
    assert len(outcome) == 1 and isinstance(outcome[0], NotEnoughReplicas), outcome
    assert "after the write was appended" in str(outcome[0])
    with pytest.raises(NotEnoughReplicas, match="nothing was written"):
        replica.check_writable()  # the next write is refused before it is appended
    replica.update(two)  # follower 2 back in sync and caught up: acknowledged as before
    replica.log.append(_rows(2, 3))
    replica.fetched(2, 5)
    replica.await_commit(5, cuts)


def test_a_read_on_a_leader_deposed_meanwhile_does_not_answer(tmp_path):
    with Store(tmp_path / "new", fsync=False) as other, Store(tmp_path / "old", fsync=False) as store:
        new_leader = other.create_table("default.kv", SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
        new_leader.upsert(_rows(4, 100))  # server 2's own changes: offsets 0..3
        table = store.create_table("default.kv", SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
        replica, kv = table.replicas[0], table.kvs[0]
        replica.become_leader(_lead(1, 1, 0, timeout=0.2))
        table.logs[0].commit_timeout_s = 0.2
        with pytest.raises(NotEnoughReplicas):
            table.upsert(_rows(3))  # in the log and the KV, never committed: follower 2 fetches nothing
        with pytest.raises(NotEnoughReplicas):
            kv.lookup(pa.table({"k": pa.array([0], pa.int64())}))  # an uncommitted row is never answered
        cuts = table.logs[0].truncations  # a lookup notes this, reads the KV (key 0 is there), then waits
        _depose(replica, new_leader.logs[0])
        table.logs[0].commit_timeout_s = 30
        with pytest.raises(NotLeader):
            kv._committed(cuts)  # the high watermark (4) passes what the read saw, but it was cut
        replica.apply_committed()
        found, rows = kv.lookup(pa.table({"k": pa.array([0, 100], pa.int64())}))
        assert found.tolist() == [False, True] and rows.column("k").to_pylist() == [100]


def test_a_late_answer_of_a_deposed_leader_is_not_appended(tmp_path):
    replica = Replica(LogTablet(tmp_path / "follower", SCHEMA, fsync=False), None, 0, fsync=False)
    replica.become_follower(_lead(1, 2, 0))
    old_leader = LogTablet(tmp_path / "old", SCHEMA, fsync=False)
    old_leader.append(_rows(3))  # server 2's uncommitted tail, sent in answer to a fetch it held while paused
    replica.become_follower(_lead(1, 3, 1))  # meanwhile server 3 leads at epoch 1
    records = old_leader.read_raw(0, 1 << 20)
    assert not replica.append_fetched(records, [0] * len(records), 3, source=2)
    assert replica.log.end_offset == 0 and replica.log.high_watermark == 0
    assert replica.epochs.entries == []



def test_a_write_whose_leader_is_deposed_before_its_ack_is_not_acknowledged(tmp_path):
    """Jepsen, seed 2 (ci14): a SIGSTOPped leader resumed and took a client's write; the view
    change deposing it landed between the append and the write's acknowledgement, so the bucket
    was no longer "led here" when the write chose what to wait for, and it was acknowledged
    without waiting; then the follower cut it. Every bucket written now awaits its commit."""
    with Store(tmp_path / "new", fsync=False) as other, Store(tmp_path / "old", fsync=False) as store:
        new_leader = other.create_table("default.kv", SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
        new_leader.upsert(_rows(4, 100))  # server 2's own changes at epoch 1: offsets 0..3
        table = store.create_table("default.kv", SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
        replica = table.replicas[0]
        replica.become_leader(_lead(1, 1, 0))
        apply_locked = table._apply_locked

        def deposed_after_the_append(*args, **kwargs):
            result = apply_locked(*args, **kwargs)
            _depose(replica, new_leader.logs[0])  # the view change and the fetcher, right after the append
            return result

        table._apply_locked = deposed_after_the_append
        with pytest.raises(NotLeader):
            table.upsert(_rows(3))
        assert table.logs[0].high_watermark == 4  # the new leader's records cover the write's offsets
        assert [r["k"] for b in table.logs[0].read(0) for r in b.batch.to_pylist()] == list(range(100, 104))


def test_a_partitioned_write_whose_leader_is_deposed_before_its_ack_is_not_acknowledged(tmp_path):
    """The same for a partitioned table's write: its units are awaited, with the truncation count
    of before the append."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("day", pa.string())])

    def rows(n: int, first: int = 0) -> pa.Table:
        return _rows(n, first).append_column("day", pa.array(["d1"] * n))

    def create(store: Store):
        return store.create_table("default.events", schema, partition_keys=["day"], options={"bucket.num": "1"})

    with Store(tmp_path / "new", fsync=False) as other, Store(tmp_path / "old", fsync=False) as store:
        new_leader = create(other)
        new_leader.append(rows(4, 100))  # server 2's own records at epoch 1
        table = create(store)
        table.append(rows(1, 50))  # the partition exists
        replica, log = table._replica_of(0), table._log_of(0)
        replica.become_leader(_lead(1, 1, 0))
        apply_units = table._apply_units

        def deposed_after_the_append(*args, **kwargs):
            result = apply_units(*args, **kwargs)
            _depose(replica, new_leader._log_of(0))  # the view change and the fetcher, right after the append
            return result

        table._apply_units = deposed_after_the_append
        with pytest.raises(NotLeader):
            table.append(rows(3))
        assert log.high_watermark == new_leader._log_of(0).end_offset
