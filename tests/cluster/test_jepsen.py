"""A Jepsen-style test of replication and failover (issue 21): three real server processes over a
real ZooKeeper (replication factor 3, min in-sync replicas 2), client *processes* writing with
writer ids to a log table, a primary-key table (partial updates, deletes) and an aggregation table,
readers and subscriptions through random servers, while a seeded nemesis kill -9s servers (the
coordinator too), pauses leaders past their ZooKeeper session (zombies), wipes a disk, and
restarts them. Then everything heals and :func:`checker.check` judges the history against the
final state (see ``tests/cluster/jepsen/checker.py`` for what is checked); besides, every server
must answer the same final state, every replica on disk (log records and KV) must be the same
once the servers stop, and no server may have died on its own (a crash leaves Python's fault
handler stacks in its log).

Everything of a run is kept under the test's tmp dir: ``history/*.jsonl`` (every operation,
read, delivered change and fault), ``final.json`` (the final state), ``verdict.json``, and the
servers' logs; ``verdict.json`` also times the phases of the run. CI runs three seeds with
``CHAOS_SECONDS`` (default 30) of faults each; ``make chaos`` runs long ones (``CHAOS_SECONDS=600
CHAOS_SEEDS=101,102``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import flightstore
from flightstore.store import Store
from tests.cluster.conftest import SESSION_TIMEOUT, Observer, Servers, in_sync
from tests.cluster.jepsen.checker import check
from tests.cluster.jepsen.client_process import changelog_sql, changes, rows_of
from tests.cluster.jepsen.history import HistoryWriter, read_history
from tests.cluster.jepsen.nemesis import Nemesis
from tests.cluster.jepsen.workload import DDL, PK_COLUMNS, WRITERS
from tests.waiting import wait_until

SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "1,2,3").split(",") if s.strip()]
SECONDS = float(os.environ.get("CHAOS_SECONDS", "30"))
IDS = (1, 2, 3)
REPLICATED = ("--option", "default.replication.factor=3",
              "--option", "log.replica.min-in-sync-replicas-number=2",
              "--option", "log.replica.max-lag-time=5s")
OP_DEADLINE_S = 25.0      # a write is retried (same writer id and sequence) until acked or this
CALL_TIMEOUT_S = 10.0     # one call; a paused server answers nothing
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 900)]


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _spawn(directory: Path, name: str, config: dict[str, Any]) -> subprocess.Popen:
    path = directory / f"{name}.json"
    path.write_text(json.dumps({**config, "name": name, "history": str(directory / "history" / f"{name}.jsonl")}))
    with open(directory / f"{name}.log", "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "tests.cluster.jepsen.client_process", str(path)],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=err, stderr=err)


def _changelog(conn: flightstore.Connection, table: str) -> list[list]:
    """``[bucket, offset, change, *row]`` of every change, sorted by bucket and offset."""
    return sorted(changes(table, conn.sql(changelog_sql(table))), key=lambda r: (r[0], r[1]))


def _final_state(uris: dict[int, str]) -> tuple[dict[str, Any], list[str]]:
    """The final state read through server 1, and how every other server's answers differ."""
    answers = {}
    for server, uri in uris.items():
        with flightstore.connect(uri, timeout=60) as conn:
            answers[server] = {
                "lg_rows": sorted(rows_of("lg", conn.sql("SELECT w, s, i FROM lg"), ["w", "s", "i"])),
                "lg_changelog": _changelog(conn, "lg"),
                "pk_rows": sorted(rows_of("pk", conn.sql(f"SELECT {', '.join(PK_COLUMNS)} FROM pk"))),
                "pk_changelog": _changelog(conn, "pk"),
                "agg_rows": sorted(rows_of("agg", conn.sql("SELECT g, v FROM agg"))),
                "agg_changelog": [r[3:] + [r[2]] for r in _changelog(conn, "agg")],
                "end_offsets": {t: {str(b): o for b, o in conn.table(t).offsets("end").items()}
                                for t in ("lg", "pk")},
            }
    first = answers[IDS[0]]
    differences = [f"server {s}: {key} differs from server {IDS[0]}'s" for s, answer in answers.items()
                   for key in answer if answer[key] != first[key]]
    return first, differences


def _replica_contents(data_dir: Path) -> dict[str, list]:
    """Per table and bucket, a stopped server's log records (offset, writer, sequence, rows) and KV
    rows: every replica must hold the same (followers append verbatim and fold the same)."""
    out: dict[str, list] = {}
    with Store(data_dir) as store:
        for name in DDL:
            local = store.local_table(f"default.{name}")
            for bucket, log in enumerate(local.logs):
                out[f"{name} bucket {bucket} log"] = [(r.base_offset, r.writer_id, r.sequence, r.batch.to_pylist())
                                                      for r in log.read(0)]
            for bucket, kv in enumerate(local.kvs or []):
                out[f"{name} bucket {bucket} kv"] = [row for batch in kv.scan() for row in batch.to_pylist()]
    return out


def _delivered(history_file: Path) -> dict[tuple[str, int], int]:
    """How many changes the reader's subscriptions delivered per (table, bucket) so far."""
    counts: dict[tuple[str, int], int] = {}
    if history_file.exists():
        for line in history_file.read_text("utf-8").splitlines():
            if '"ev":"sub"' not in line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            for row in event["rows"]:
                key = (event["table"], int(row[0]))
                counts[key] = counts.get(key, 0) + 1
    return counts


def _all_in_sync(uris: dict[int, str]) -> bool:
    try:
        return all(in_sync(uris, f"default.{t}", set(IDS)) for t in DDL)
    except Exception:  # noqa: BLE001 - a server still starting: not yet
        return False


def run(seed: int, seconds: float, servers: Servers, observer: Observer, directory: Path) -> dict[str, Any]:
    """One run: the cluster, the clients, the nemesis, healing, the final state, the verdict."""
    (directory / "history").mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}
    clock = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - clock[0], 1)
        clock[0] = now
    history = HistoryWriter(directory / "history" / "nemesis.jsonl", "nemesis")
    ports = dict(zip(IDS, _free_ports(len(IDS))))
    nemesis = Nemesis(servers, observer, IDS, ports, REPLICATED, history, seed,
                      session_timeout_s=float(SESSION_TIMEOUT.rstrip("s")))
    uris: dict[int, str] = {}
    starters = [threading.Thread(target=lambda i=i: uris.__setitem__(i, nemesis.start_server(i))) for i in IDS]
    for thread in starters:
        thread.start()
    for thread in starters:
        thread.join(300)
    assert set(uris) == set(IDS), "a server did not start"
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1], timeout=120) as conn:
        for ddl in DDL.values():
            conn.sql(ddl)
    wait_until(lambda: _all_in_sync(uris), "the tables replicated on every server", timeout=120, poll=0.5)

    base = {"seed": seed, "uris": [uris[i] for i in IDS], "op_deadline_s": OP_DEADLINE_S,
            "call_timeout_s": CALL_TIMEOUT_S, "writers": WRITERS, "stall_s": 12.0}
    stop_writers, stop_readers = directory / "stop-writers", directory / "stop-readers"
    writers = [_spawn(directory, f"writer-{p}", {**base, "role": "writer", "proc": p, "stop_file": str(stop_writers)})
               for p in range(WRITERS)]
    reader = _spawn(directory, "reader", {**base, "role": "reader", "stop_file": str(stop_readers)})
    phase("setup")
    try:
        nemesis.start(seconds)
        nemesis._thread.join(seconds + 300)
        nemesis.stop()
        phase("faults")
        stop_writers.touch()
        for process in writers:
            process.wait(OP_DEADLINE_S + 120)
        wait_until(lambda: _all_in_sync(uris), "every ISR full after healing", timeout=180, poll=0.5)
        phase("heal")
        final, differences = _final_state(uris)
        wanted = {(t, int(b)): int(e) for t, ends in final["end_offsets"].items() for b, e in ends.items()}
        reader_history = directory / "history" / "reader.jsonl"
        caught_up = True
        try:
            wait_until(lambda: all(_delivered(reader_history).get(k, 0) >= e for k, e in wanted.items()),
                       "the subscriptions delivering every change", timeout=90, poll=1.0)
        except AssertionError:
            caught_up = False  # the checker names what was not delivered
        stop_readers.touch()
        reader.wait(CALL_TIMEOUT_S + 60)
        phase("final reads")
        for server in IDS:  # every replica the same, read from the stopped servers' disks
            servers.running[server].terminate()
        exits = {server: servers.running[server].stop() for server in IDS}  # stopped together: 0 each
        replicas = {server: _replica_contents(servers.root / f"server-{server}") for server in IDS}
        differences += [f"server {s}: the replica of {key} differs from server {IDS[0]}'s"
                        for s in IDS[1:] for key in replicas[IDS[0]] if replicas[s].get(key) != replicas[IDS[0]][key]]
    finally:
        stop_writers.touch()
        stop_readers.touch()
        for process in [*writers, reader]:
            if process.poll() is None:
                process.kill()
        history.close()
    events = list(read_history(directory / "history"))
    verdict = check(events, final)
    phase("replicas and check")
    if nemesis.crashes:
        verdict["valid"] = False
        verdict["problems"]["servers crashed (see server-N.log: Python's fault handler traceback)"] = nemesis.crashes
        verdict["problem_counts"]["servers crashed"] = len(nemesis.crashes)
    unclean = {server: code for server, code in exits.items() if code != 0}
    if unclean:  # 1: the hard exit of a shutdown still waiting for calls (the others' fetch streams)
        verdict["valid"] = False
        verdict["problems"]["servers stopped uncleanly (exit code; see server-N.log)"] = unclean
        verdict["problem_counts"]["servers stopped uncleanly"] = len(unclean)
    if differences:
        verdict["valid"] = False
        verdict["problem_counts"]["final: servers (or their replicas) differ"] = len(differences)
        verdict["problems"]["final: servers (or their replicas) differ"] = differences
    verdict["stats"].update(seed=seed, phases=phases, faults=nemesis.faults,
                            subscriptions_caught_up=caught_up)
    (directory / "final.json").write_text(json.dumps(final, default=str))
    (directory / "verdict.json").write_text(json.dumps(verdict, indent=1, default=str))
    return verdict


@pytest.mark.parametrize("seed", SEEDS)
def test_acknowledged_writes_survive_kills_pauses_and_lost_disks(seed, servers, observer, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # a server that crashes leaves its threads' stacks in its log
    verdict = run(seed, SECONDS, servers, observer, tmp_path)
    print(json.dumps(verdict["stats"], default=str))
    assert verdict["stats"]["ops"].get("pk:ok", 0) > 0 and verdict["stats"]["ops"].get("lg:ok", 0) > 0, \
        f"seed {seed}: too few acknowledged writes to judge anything: {verdict['stats']}"
    shown = json.dumps(verdict["problems"], default=str)[:3000]
    assert verdict["valid"], (f"seed {seed}: {verdict['problem_counts']}; first problems: {shown}; "
                              f"history and verdict in {tmp_path}")
