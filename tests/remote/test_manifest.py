"""Manifests replaced atomically without a rename: a torn newest version is skipped (the previous
one reads), and a writer killed with SIGKILL anywhere in its upload loop leaves a manifest that
reads, with every segment it lists whole."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flightstore.remote import RemoteLogManager
from flightstore.remote.manifest import VersionedManifest
from flightstore.store import Store
from tests.remote.tables import EVENTS, TIERED, events

ROOT = Path(__file__).resolve().parents[2]


def test_a_torn_newest_manifest_is_skipped_for_the_previous_one(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(4):
            table.write(events(i * 10, 10))
        manager = RemoteLogManager(store, 1000)
        manager.run_once()
        remote = table.logs[0].remote
        complete = remote.log_manifest()
        for i in range(4, 6):
            table.write(events(i * 10, 10))
        manager.run_once()
        newest = remote.log_manifest()
        assert len(newest.segments) > len(complete.segments)
        # The newest version cut short, as a crash in the middle of writing it in place leaves it.
        path = Path(remote.path) / "log" / "manifest" / f"{newest.version:020d}.json"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        versions = VersionedManifest(store.remote, f"{remote.path}/log", remote.label)
        version, body = versions.load()
        assert version == complete.version and len(body["segments"]) == len(complete.segments)
        # A writer after the torn one writes above it, never under its number.
        assert versions.commit(body, version) == newest.version + 1
        assert versions.load()[0] == newest.version + 1


def _run_and_kill(data_dir: Path, remote_dir: Path, rng: random.Random) -> int:
    """Start the writer, SIGKILL it after a random number of rounds (plus a random few
    milliseconds: anywhere inside an upload); return the rows it acknowledged."""
    child = subprocess.Popen([sys.executable, "-m", "tests.remote.upload_child", str(data_dir),
                              str(remote_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    progressed = threading.Condition()
    wanted = rng.randint(2, 6)

    def reader() -> None:
        for line in child.stdout:
            if line.strip().isdigit():
                with progressed:
                    acked.append(int(line))
                    progressed.notify_all()

    assert child.stdout.readline().strip() == "ready"
    thread = threading.Thread(target=reader)
    thread.start()
    with progressed:
        assert progressed.wait_for(lambda: len(acked) >= wanted or child.poll() is not None,
                                   timeout=120), "the writer acknowledged nothing within 120 s"
    time.sleep(rng.uniform(0, 0.03))  # where inside the next round the kill lands, not a wait
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join()
    return acked[-1] if acked else 0


@pytest.mark.slow
def test_kill_minus_nine_during_uploads_leaves_a_manifest_that_reads(tmp_path):
    rng = random.Random(21)
    data_dir, remote_dir = tmp_path / "data", tmp_path / "remote"
    acknowledged = max(_run_and_kill(data_dir, remote_dir, rng) for _ in range(4))
    with Store(data_dir, fsync=False, options={"remote.data.dir": str(remote_dir)}) as store:
        table = store.table("default.ev")
        log = table.logs[0]
        manifest = log.remote.log_manifest()
        assert manifest.segments and log.local_start_offset > 0
        for entry in manifest.segments:  # every listed segment is there, whole (checksums)
            segment, release = log.remote.open_segment(entry)
            assert segment.next_offset == entry.next_offset
            release()
        seqs = table.scan_table().column("seq").to_pylist()
        assert len(seqs) >= acknowledged and sorted(seqs) == list(range(len(seqs)))
        assert log.start_offset == 0


def test_a_bucket_taking_over_uploads_reads_the_manifest_again(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        manager = RemoteLogManager(store, 1000)
        for i in range(3):
            table.write(events(i * 10, 10))
        manager.run_once()
        uploader = table.logs[0].remote
        other = uploader.table.bucket(0, uploader.label)  # the same bucket seen by another server
        seen = other.log_manifest()
        for i in range(3, 6):
            table.write(events(i * 10, 10))
        manager.run_once()
        assert other.log_manifest() is seen and uploader.log_manifest().version > seen.version
        other.refresh()
        assert other.log_manifest() == uploader.log_manifest()
