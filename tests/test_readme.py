"""The README's first steps give what they say: the tour (twice: it must be re-runnable), the ADBC,
lookuper, SQLAlchemy/pandas/polars, KV snapshot and partition snippets (README.md and docs/) print
and store what they claim against a real server; `make run` installs the runtime only (with
progress shown), and the ADBC snippet's modules come with it; `make superset` runs the setup the
Superset test drives. tests/test_docs.py runs every block of every page as written."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks() -> list[str]:
    return [block for page in PAGES for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def _block(marker: str) -> str:
    found = [b for b in _python_blocks() if marker in b]
    assert len(found) == 1, marker
    return found[0]


def test_tour_and_client_snippets_run_twice(server, capsys) -> None:
    snippets = [_block("CREATE TABLE IF NOT EXISTS shop.orders"), _block("cur.fetch_arrow_table()"),
                _block("sa.create_engine"), _block("orders.lookuper(")]
    address = server.uri.split("//")[1]
    for _ in range(2):
        for code in snippets:
            code = code.replace("grpc://127.0.0.1:8815", server.uri)
            exec(compile(code.replace("flightstore://127.0.0.1:8815", f"flightstore://{address}"),
                         "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "'_change_type': '+I'" in printed
    assert "[1, 1, 0]\n[{'status': 'shipped'}]" in printed  # the lookuper snippet
    orders = server.store.table("shop.orders").scan_table().sort_by("order_id").to_pylist()
    assert [(r["order_id"], r["status"]) for r in orders] == [(1, "paid"), (2, "shipped")]
    assert server.store.table("people").row_count() == 2


def _plan(target: str, venv: Path) -> str:
    return subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True).stdout


def test_make_run_installs_the_runtime_only_and_shows_progress(tmp_path) -> None:
    run = _plan("run", tmp_path / "venv")
    installs = [line for line in run.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert len(installs) == 1 and installs[0].endswith(" -e .")
    assert " -q" not in installs[0]  # pip shows what it downloads and installs: no silent minute
    assert "[test" not in run and "pyspark" not in run
    assert "flightstore serve" in run
    test = _plan("test", tmp_path / "venv")
    assert "'.[test,sqlalchemy]'" in test and " -e .\n" in test
    # the other clients' venvs are installed before the suite, not built while it runs
    assert test.index("-m tests.client_venvs\n") < test.index("-m pytest ")


def test_make_superset_runs_the_launcher_the_superset_test_uses(tmp_path) -> None:
    superset = _plan("superset", tmp_path / "venv")
    assert "-m flightstore_sqlalchemy.superset_launch --flightstore grpc://127.0.0.1:8815" in superset
    assert "[test" not in superset  # the runtime is enough: Superset gets its own venv
    test = (ROOT / "tests" / "sqlalchemy_dialect" / "test_superset.py").read_text()
    for step in ("superset_launch.superset_python(", "superset_launch.prepare(", "superset_launch.start("):
        assert step in test


def _requirements(distribution: str, seen: set[str]) -> None:
    """``seen`` plus ``distribution`` and everything it requires unconditionally (no extras)."""
    name = re.sub(r"[-_.]+", "-", distribution).lower()
    if name in seen:
        return
    seen.add(name)
    for requirement in metadata.requires(distribution) or []:
        if ";" in requirement and "extra ==" in requirement.split(";", 1)[1]:
            continue
        if ";" in requirement and not _marker_holds(requirement.split(";", 1)[1]):
            continue
        _requirements(re.match(r"[A-Za-z0-9_.-]+", requirement).group(), seen)


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker
    return Marker(marker).evaluate()


def test_the_adbc_snippet_needs_only_the_runtime() -> None:
    """`make run` installs flightstore without extras: every module the README's ADBC snippet
    imports comes with that install (issue: "No module named 'adbc_driver_flightsql'")."""
    runtime: set[str] = set()
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        _requirements(re.match(r"[A-Za-z0-9_.-]+", requirement).group(), runtime)
    snippet = _block("cur.fetch_arrow_table()")
    modules = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from)\s+([\w.]+)", snippet, flags=re.M)}
    assert modules, snippet
    providers = metadata.packages_distributions()
    for module in modules:
        distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])}
        assert distributions & runtime, (module, distributions, "not in flightstore's runtime dependencies")


def test_kv_snapshot_snippet_runs_after_the_tour(server) -> None:
    tour = _block("CREATE TABLE IF NOT EXISTS shop.orders").replace("grpc://127.0.0.1:8815", server.uri)
    snippet = _block("orders.snapshot()").replace("grpc://127.0.0.1:8815", server.uri)
    namespace: dict = {}
    exec(compile(tour, "README.md", "exec"), namespace)
    exec(compile(snippet, "README.md", "exec"), namespace)
    table = server.store.table("shop.orders")
    assert all(kv.snapshots.newest is None or kv.snapshots.newest.offset == table.end_offsets()[b]
               for b, kv in enumerate(table.kvs))
    assert any(kv.snapshots.newest is not None for kv in table.kvs)


def test_partition_and_alter_snippet_runs_twice(server, capsys) -> None:
    code = _block("PARTITIONED BY (dt)").replace("grpc://127.0.0.1:8815", server.uri)
    for _ in range(2):  # re-runnable: it drops and recreates its table
        exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    table = server.store.table("shop.visits")
    names = sorted(p.name for p in table.descriptor.partitions)
    assert len(names) == 2 and "20240101" not in names  # today and tomorrow; the old one dropped
    assert f"partitions=[{names[0]}]" in printed or f"partitions=[{names[1]}]" in printed
    rows = sorted(table.scan_table(["user_id", "referrer"]).to_pylist(), key=lambda r: r["user_id"])
    assert rows == [{"user_id": 1, "referrer": None}, {"user_id": 3, "referrer": "search"}]
