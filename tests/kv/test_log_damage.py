"""A primary-key table whose log is damaged: nothing valid is deleted, the KV keeps serving the
table, and every read of a lost changelog range is DataLoss naming the table and the bucket."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.catalog import read_table_dir
from flightstore.errors import DataLoss
from flightstore.log.walk import walk_records
from flightstore.store import Store

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


def build(data_dir: Path, rounds: int = 40) -> tuple[dict[int, str], list[dict]]:
    """A PK table ``t`` written in ``rounds`` upserts (new keys and updates, one log record each);
    returns the final state and the whole changelog."""
    with Store(data_dir, fsync=False) as store:
        table = store.create_table("t", SCHEMA, primary_key=["id"])
        state: dict[int, str] = {}
        for r in range(rounds):
            ids = list(range(r * 3, r * 3 + 5))  # 3 new keys, 2 updated ones
            rows = {"id": ids, "v": [f"{i}@{r}" for i in ids]}
            table.upsert(rows)
            state.update(zip(ids, rows["v"]))
        changelog = [row for batch in table.read_changelog(0) for row in batch.to_pylist()]
    return state, changelog


def log_file(data_dir: Path) -> Path:
    [path] = (read_table_dir(data_dir, "t") / "bucket-0" / "log").glob("*.log")
    return path


def records(path: Path) -> list:
    with open(path, "rb") as handle:
        fd = handle.fileno()
        return walk_records(lambda n, p: os.pread(fd, n, p), os.fstat(fd).st_size, 0, 0, True).records


def crash(path: Path) -> None:
    """Drop the checkpoint the clean close wrote: what a killed server leaves behind."""
    for summary in path.parent.glob("*.summary"):
        summary.unlink()


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def current(table) -> dict[int, str]:
    return {row["id"]: row["v"] for row in table.scan_table().to_pylist()}


def changelog_from(table, offset: int) -> list[dict]:
    return [row for batch in table.read_changelog(0, offset) for row in batch.to_pylist()]


@pytest.mark.parametrize("crashed", [False, True], ids=["clean-close", "killed"])
@pytest.mark.parametrize("where", ["payload", "header"])
def test_flipped_byte_mid_log_keeps_every_valid_record(tmp_path: Path, crashed: bool,
                                                       where: str) -> None:
    data_dir = tmp_path / "data"
    state, changelog = build(data_dir)
    path = log_file(data_dir)
    good = records(path)
    bad = good[len(good) // 2]
    size = path.stat().st_size
    flip(path, bad.payload_position + bad.payload_len // 2 if where == "payload"
         else bad.position + 20)
    if crashed:
        crash(path)
    with Store(data_dir, fsync=False) as store:
        table = store.table("t")
        assert path.stat().st_size == size  # nothing cut
        end = good[-1].next_offset
        assert table.end_offsets() == {0: end}
        # the KV is the table's state: lookups, scans and counts answer in full
        assert current(table) == state
        assert table.row_count() == len(state)
        assert table.lookup({"id": [0, 60]}).to_pylist() == [{"id": 0, "v": state[0]},
                                                              {"id": 60, "v": state[60]}]
        # every record after the bad one is kept, with its own offsets
        assert changelog_from(table, bad.next_offset) == changelog[bad.next_offset:]
        with pytest.raises(DataLoss, match=rf"table default\.t bucket 0: log offsets "
                                           rf"{bad.base_offset}\.\.{bad.next_offset - 1} "):
            changelog_from(table, 0)
        # writes go on after the loss without reusing offsets
        table.upsert({"id": [1000], "v": ["new"]})
        assert [(r["id"], r["_change_type"], r["_log_offset"]) for r in changelog_from(table, end)] \
            == [(1000, "+I", end)]


@pytest.mark.parametrize("crashed", [False, True], ids=["clean-close", "killed"])
def test_log_that_lost_its_tail_behind_the_kv_still_opens_and_serves(tmp_path: Path,
                                                                      crashed: bool) -> None:
    """The last 100 bytes of the log vanish after the KV applied them: the table opens, the KV
    serves, the lost changelog range is DataLoss, and new changes do not reuse its offsets."""
    data_dir = tmp_path / "data"
    state, changelog = build(data_dir)
    path = log_file(data_dir)
    good = records(path)
    end = good[-1].next_offset
    os.truncate(path, path.stat().st_size - 100)
    if crashed:
        crash(path)
    with Store(data_dir, fsync=False) as store:
        table = store.table("t")
        assert current(table) == state
        assert table.row_count() == len(state)
        assert table.end_offsets() == {0: end}
        assert table.logs[0].damage() == [(good[-1].base_offset, end)]
        assert [r for b in table.read_changelog(0, 0, to_offset=good[-1].base_offset)
                for r in b.to_pylist()] == changelog[:good[-1].base_offset]
        with pytest.raises(DataLoss, match=rf"table default\.t bucket 0: log offsets "
                                           rf"{good[-1].base_offset}\.\.{end - 1} are lost"):
            changelog_from(table, 0)
        table.upsert({"id": [0], "v": ["after"]})
        assert [(r["_log_offset"], r["_change_type"]) for r in changelog_from(table, end)] == [
            (end, "-U"), (end + 1, "+U")]
    with Store(data_dir, fsync=False) as store:  # and again after a restart
        table = store.table("t")
        assert current(table) == state | {0: "after"}
        with pytest.raises(DataLoss):
            changelog_from(table, 0)
