"""`flightstore verify` and `flightstore repair`, run as commands on real damaged data directories."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore import changetype
from flightstore.catalog import read_table_dir
from flightstore.store import Store
from tests.kv.test_log_damage import build, flip, log_file, records

ROOT = Path(__file__).resolve().parents[1]
LOG_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string())])


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightstore", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False)


def snapshot(data_dir: Path) -> dict:
    """Content hash and mtime of every file: what 'changes nothing' means."""
    return {str(p.relative_to(data_dir)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                           p.stat().st_mtime_ns)
            for p in sorted(data_dir.rglob("*")) if p.is_file()}


def lenient_fold(table) -> dict:
    """The changelog folded by last image per key (what a KV rebuilt from it would hold)."""
    state: dict = {}
    for bucket in range(table.num_buckets):
        for batch in table.read_changelog(bucket, 0):
            for row in batch.to_pylist():
                kind = row.pop(changetype.CHANGE_TYPE_COLUMN)
                row.pop(changetype.LOG_OFFSET_COLUMN)
                row.pop(changetype.COMMIT_TIMESTAMP_COLUMN)
                if kind in ("+I", "+U"):
                    state[row["id"]] = row
                elif kind == "-D":
                    state.pop(row["id"], None)
    return state


def kv_rows(table) -> dict:
    return {row["id"]: row for row in table.scan_table().to_pylist()}


def add_log_table(data_dir: Path, segment_bytes: int = 1024) -> list[int]:
    """A log table ``lg`` of 12 records of 10 rows, in many small segments; returns the rows."""
    with Store(data_dir, fsync=False) as store:
        table = store.create_table("lg", LOG_SCHEMA,
                                   options={"table.log.segment.bytes": segment_bytes})
        for start in range(0, 120, 10):
            table.append({"a": list(range(start, start + 10)), "b": ["x" * 40] * 10})
    return list(range(120))


def test_verify_of_a_healthy_directory_passes_and_changes_nothing(tmp_path):
    data_dir = tmp_path / "data"
    build(data_dir)
    add_log_table(data_dir)
    before = snapshot(data_dir)
    done = run("verify", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "flightstore verify: 0 error(s), 0 warning(s)" in done.stdout
    assert snapshot(data_dir) == before


def test_flipped_byte_mid_log_of_a_pk_table_verify_repair_verify(tmp_path):
    data_dir = tmp_path / "data"
    state, changelog = build(data_dir)
    path = log_file(data_dir)
    good = records(path)
    bad = good[len(good) // 2]
    flip(path, bad.payload_position + bad.payload_len // 2)
    bad_bytes = path.read_bytes()[bad.position:bad.end_position]
    lost = f"offsets {bad.base_offset}..{bad.next_offset - 1}"

    before = snapshot(data_dir)
    done = run("verify", str(data_dir))
    assert done.returncode == 1
    assert f"ERROR   table default.t bucket 0: {lost} are lost" in done.stdout
    assert snapshot(data_dir) == before  # verify changes nothing

    done = run("repair", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"table default.t bucket 0: {lost} declared lost" in done.stdout
    assert "the changelog was completed from the KV" in done.stdout
    [kept] = (path.parent / "quarantine").glob("*.bad")
    assert kept.read_bytes() == bad_bytes  # moved aside, not destroyed

    done = run("verify", str(data_dir))
    assert done.returncode == 0, done.stdout
    assert f"{lost} were declared lost by repair" in done.stdout

    with Store(data_dir, fsync=False) as store:
        table = store.table("t")
        assert {k: r["v"] for k, r in kv_rows(table).items()} == state  # nothing else lost
        assert lenient_fold(table) == kv_rows(table)  # the changelog folds to the KV again
        rows = [r for b in table.read_changelog(0, 0) for r in b.to_pylist()]
        offsets = [r["_log_offset"] for r in rows]
        assert not set(range(bad.base_offset, bad.next_offset)) & set(offsets)
        assert rows[:bad.base_offset] == changelog[:bad.base_offset]  # every valid record kept
        assert rows[bad.base_offset:len(changelog) - bad.num_rows] == changelog[bad.next_offset:]
        table.kvs[0].rebuild()  # a KV rebuilt from the repaired log is the same table
        assert {k: r["v"] for k, r in kv_rows(table).items()} == state
        table.upsert({"id": [9999], "v": ["after"]})
        assert table.lookup({"id": [9999]}).to_pylist() == [{"id": 9999, "v": "after"}]


@pytest.mark.parametrize("killed", [False, True], ids=["clean-close", "killed"])
def test_log_that_lost_its_tail_behind_the_kv_is_declared_and_repaired(tmp_path, killed):
    data_dir = tmp_path / "data"
    state, _ = build(data_dir)
    path = log_file(data_dir)
    good = records(path)
    end = good[-1].next_offset
    os.truncate(path, path.stat().st_size - 100)
    if killed:
        for summary in path.parent.glob("*.summary"):
            summary.unlink()
    done = run("verify", str(data_dir))
    assert done.returncode == 1
    assert f"{good[-1].base_offset}..{end - 1}" in done.stdout
    done = run("repair", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"offsets {good[-1].base_offset}..{end - 1} declared lost" in done.stdout
    assert run("verify", str(data_dir)).returncode == 0
    with Store(data_dir, fsync=False) as store:
        table = store.table("t")
        assert {k: r["v"] for k, r in kv_rows(table).items()} == state
        assert lenient_fold(table) == kv_rows(table)
        assert table.end_offsets()[0] >= end


def test_corrupt_and_missing_segments_of_a_log_table(tmp_path):
    data_dir = tmp_path / "data"
    rows = add_log_table(data_dir)
    log_dir = read_table_dir(data_dir, "lg") / "bucket-0" / "log"
    segments = sorted(log_dir.glob("*.log"))
    assert len(segments) >= 6
    flip(segments[1], 20)  # a header of a sealed segment
    segments[3].unlink()  # a whole segment gone
    done = run("verify", str(data_dir))
    assert done.returncode == 1
    assert done.stdout.count("ERROR   table default.lg bucket 0") == 2
    assert "no segment holds them" in done.stdout
    done = run("repair", str(data_dir), "--table", "default.lg")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("declared lost") == 2
    assert run("verify", str(data_dir)).returncode == 0
    with Store(data_dir, fsync=False) as store:
        table = store.table("lg")
        got = table.scan_table().column("a").to_pylist()
        assert set(got) < set(rows) and len(got) == len(rows) - 20 and got == sorted(got)
        assert table.row_count() == len(got)  # declared losses are not counted as rows


def test_corrupt_kv_is_reported_and_rebuilt_from_the_complete_log(tmp_path):
    data_dir = tmp_path / "data"
    state, _ = build(data_dir, rounds=400)
    kv_dir = read_table_dir(data_dir, "t") / "bucket-0" / "kv"
    sst = max(kv_dir.glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(sst.read_bytes())
    data[len(data) // 3] ^= 0x40
    sst.write_bytes(bytes(data))
    before = snapshot(data_dir)
    done = run("verify", str(data_dir))
    assert done.returncode == 1
    assert "table default.t bucket 0: the KV is unreadable" in done.stdout
    assert "checksum mismatch" in done.stdout
    assert snapshot(data_dir) == before
    done = run("repair", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rebuilt from the complete log" in done.stdout
    assert run("verify", str(data_dir)).returncode == 0
    with Store(data_dir, fsync=False) as store:
        assert {k: r["v"] for k, r in kv_rows(store.table("t")).items()} == state


def test_torn_intent_is_a_warning_not_an_error(tmp_path):
    data_dir = tmp_path / "data"
    build(data_dir)
    table_dir = read_table_dir(data_dir, "t")
    (table_dir / "intent").write_bytes(b"FSIN" + b"\x00" * 20)  # a crash mid-way through begin()
    done = run("verify", str(data_dir))
    assert done.returncode == 0
    assert "WARNING table default.t: the intent log holds a torn record" in done.stdout
    with Store(data_dir, fsync=False) as store:  # and the open discards it
        assert store.table("t").row_count() > 0
    assert run("verify", str(data_dir)).stdout.count("WARNING") == 0


def test_verify_and_repair_refuse_a_directory_a_server_holds(tmp_path):
    data_dir = tmp_path / "data"
    build(data_dir)
    server = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir",
                               str(data_dir), "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert "flightstore serving" in server.stdout.readline()
        for command in ("verify", "repair"):
            done = run(command, str(data_dir))
            assert done.returncode == 2
            assert f"pid {server.pid}" in done.stderr and "Traceback" not in done.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_repair_of_an_unknown_table_is_refused(tmp_path):
    data_dir = tmp_path / "data"
    build(data_dir)
    done = run("repair", str(data_dir), "--table", "nope")
    assert done.returncode == 2
    assert "table default.nope does not exist" in done.stderr


def test_hole_the_kv_has_not_applied_refuses_to_open_until_repaired(tmp_path):
    """A KV behind its log (as after a crash between log append and KV write) and a lost record in
    the part still to replay: the table must not open with a KV that silently misses changes."""
    import shutil

    from flightstore.errors import DataLoss

    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        table = store.create_table("t", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                                   ("v", pa.string())]), primary_key=["id"])
        table.upsert({"id": [1, 2], "v": ["a", "b"]})
        kv_dir = read_table_dir(data_dir, "t") / "bucket-0" / "kv"
    shutil.copytree(kv_dir, tmp_path / "old-kv")  # the KV as of offset 2
    with Store(data_dir, fsync=False) as store:
        table = store.table("t")
        table.upsert({"id": [3], "v": ["c"]})  # offset 2, to be lost
        table.upsert({"id": [4], "v": ["d"]})  # offset 3
    shutil.rmtree(kv_dir)
    shutil.copytree(tmp_path / "old-kv", kv_dir)
    path = log_file(data_dir)
    lost = records(path)[1]
    flip(path, lost.payload_position + lost.payload_len // 2)
    with Store(data_dir, fsync=False) as store, \
            pytest.raises(DataLoss, match=r"table default\.t bucket 0: log offsets 2\.\.2"):
        store.table("t")
    done = run("verify", str(data_dir))
    assert done.returncode == 1 and "the KV has not applied offsets 2..2" in done.stdout
    done = run("repair", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offsets 2..2 declared lost" in done.stdout
    assert "the KV had not applied offsets 2..2 before they were lost" in done.stdout
    with Store(data_dir, fsync=False) as store:
        assert sorted(store.table("t").scan_table().to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 4, "v": "d"}]
