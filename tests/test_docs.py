"""Every code block of README.md and docs/*.md runs as written, against a real server (issue 25):
a recipe that fails as written fails here.

Conventions (README.md, "Documentation", says them to readers):
* Blocks assume a server at ``grpc://127.0.0.1:8815`` (``make run``) where the README's tour ran:
  each page gets its own server on a free port, the URI is rewritten to it (in shell blocks the
  ``flightstore`` commands that default to that URI get ``--uri``), and the tour runs before the
  blocks of every page under docs/.
* A page's blocks run in order, in one Python namespace and one SQL connection (``USE`` holds),
  in a scratch directory whose ``./data`` is the server's data directory.
* ``python`` blocks are executed; ``sql`` blocks run statement by statement (each ends with ``;``
  at the end of a line) through the Python client; ``bash`` blocks run in bash (-e, pipefail),
  with ``$PW`` set; ``console`` blocks are ``$ cmd`` lines, each followed by the exact output the
  command must print.
* ``<!-- run: server-stopped -->`` before a block stops the server for it (verify, repair, the
  embedded Store) and starts it again on the same data directory afterwards.
* ``<!-- not-run: REASON -->`` before a block skips it; every other language (yaml, text) must
  carry one, and a reason that names a test (``tests/x.py::test_y``) must name one that exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import flightstore
from flightstore.config import options_page
from tests.server.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md"))
DOC_URI = "grpc://127.0.0.1:8815"
RUNNABLE = {"python", "sql", "bash", "console"}
PASSWORD = "docs-password"
_FENCE = re.compile(r"```(\S*)\s*")
_MARK = re.compile(r"<!--\s*(not-run|run):\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: tuple[str, str] | None  # ("not-run", reason) or ("run", "server-stopped")

    @property
    def runs(self) -> bool:
        return self.mark is None or self.mark[0] == "run"


def page_blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.fullmatch(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = _MARK.fullmatch(before)
        found.append(Block(page, i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           (mark.group(1), mark.group(2)) if mark else None))
        i = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]
TOUR = next(b for b in ALL_BLOCKS if b.page == "README.md" and b.lang == "python")


def test_every_block_runs_or_says_why() -> None:
    assert len(ALL_BLOCKS) > 20 and {b.page for b in ALL_BLOCKS} >= {"README.md", "docs/sql.md"}
    for block in ALL_BLOCKS:
        where = f"{block.page}:{block.line}"
        assert block.lang, f"{where}: a code block names its language (python, sql, bash, console...)"
        if block.mark is None:
            assert block.lang in RUNNABLE, f"{where}: a {block.lang} block needs <!-- not-run: reason -->"
            continue
        kind, text = block.mark
        if kind == "run":
            assert text == "server-stopped" and block.lang in RUNNABLE, where
            continue
        assert len(text) > 20, f"{where}: say why the block cannot run here"
        for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text):
            assert (ROOT / path).is_file(), f"{where}: {path} does not exist"
            if name:
                assert f"def {name}(" in (ROOT / path).read_text(), f"{where}: {path} has no {name}"


def test_options_page_is_generated_from_the_registry() -> None:
    assert (ROOT / "docs" / "options.md").read_text() == options_page(), \
        "docs/options.md is stale: python -m flightstore options --page > docs/options.md"


def test_the_site_builds_strictly(tmp_path) -> None:
    """`make docs`: no broken link or anchor, no warning (mkdocs --strict), README as the front page."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr
    front = (tmp_path / "site" / "index.html").read_text()
    assert "A 5-minute tour" in front and 'href="clients/"' in front
    # --no-print-directory: under `make test` this make is a sub-make, which names its directory.
    plan = subprocess.run(["make", "--no-print-directory", "-n", "docs", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert "'.[docs]'" in plan and plan.rstrip().endswith("mkdocs build --strict")


class PageRun:
    """The server, namespace, SQL connection and shell of one page's blocks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = ServerProcess(directory / "data")
        self.namespace: dict = {"__name__": "__docs__"}
        self.conn: flightstore.Connection | None = None
        self.bin = directory / ".bin"
        self.bin.mkdir()
        # `flightstore` is this checkout's CLI; the commands that default to DOC_URI get --uri.
        (self.bin / "flightstore").write_text(f"""#!{sys.executable}
import os, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "connectors" / "spark")!r}]
args = sys.argv[1:]
words = 2 if args[:1] in (["lake"], ["cluster"]) else 1
if args[:1] in (["sql"], ["snapshot"], ["lake"]) and "--uri" not in args:
    args[words:words] = ["--uri", os.environ["DOCS_URI"]]
from flightstore.cli import main
main(args)
""")
        (self.bin / "flightstore").chmod(0o755)
        (self.bin / "python").symlink_to(sys.executable)

    def rewrite(self, code: str) -> str:
        address = self.server.uri.split("//", 1)[1]
        return (code.replace(DOC_URI, self.server.uri).replace("flightstore://127.0.0.1:8815", f"flightstore://{address}")
                .replace(".venv/bin/flightstore", "flightstore"))

    def run(self, block: Block) -> None:
        if block.mark == ("run", "server-stopped"):
            self.close()
            self.server.stop()
            try:
                self._run(block)
            finally:
                self.server = ServerProcess(self.directory / "data")
        else:
            self._run(block)

    def _run(self, block: Block) -> None:
        code = self.rewrite(block.code)
        where = f"{block.page}:{block.line}"
        if block.lang == "python":
            exec(compile(code, where, "exec"), self.namespace)
        elif block.lang == "sql":
            if self.conn is None:
                self.conn = flightstore.connect(self.server.uri)
            text = "\n".join(line.split("--", 1)[0] for line in code.splitlines())
            for statement in filter(None, (s.strip() for s in re.split(r";\s*$", text, flags=re.M))):
                self.conn.sql(statement)
        elif block.lang == "bash":
            done = self.shell(code)
            assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        elif block.lang == "console":
            for command, expected in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", code, flags=re.M):
                done = self.shell(command)
                assert done.returncode == 0, f"{where}: {command}: {done.stderr}"
                assert done.stdout == expected, f"{where}: {command} printed\n{done.stdout}"
        else:
            raise AssertionError(f"{where}: no runner for {block.lang}")

    def shell(self, code: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", DOCS_URI=self.server.uri,
                   PW=PASSWORD, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'connectors' / 'spark'}")
        env.pop("FLIGHTSTORE_PASSWORD", None)
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=self.directory, env=env,
                              input=PASSWORD + "\n", capture_output=True, text=True, timeout=180)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def stop(self) -> None:
        self.close()
        # What a program's exit does: the connections, streams and cursors its blocks opened end
        # before the server stops (an in-process server aborted at shutdown under open streams).
        for value in list(self.namespace.values()):
            module = type(value).__module__ or ""
            if module.startswith(("flightstore", "adbc_driver")) and callable(getattr(value, "close", None)):
                with contextlib.suppress(Exception):
                    value.close()
        self.server.stop()


RUN_PAGES = [page for page in PAGES if any(b.page == page and b.runs for b in ALL_BLOCKS)]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_blocks_of_a_page_run_as_written(page, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = PageRun(tmp_path)
    try:
        if page != "README.md":
            run.run(TOUR)
        for block in page_blocks(page):
            if block.runs:
                run.run(block)
    finally:
        run.stop()
