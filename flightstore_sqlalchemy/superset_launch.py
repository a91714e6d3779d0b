"""``make superset``: Apache Superset against a running flightstore, in one command.

Superset 6.1 cannot share flightstore's virtualenv (it pins SQLAlchemy 1.4, and pip backtracks
through every Superset release on a pyarrow pin), so it gets its own, made once and cached:
:func:`superset_python` installs :data:`REQUIREMENTS` (Superset as packaged also needs ``rich``,
``cachetools`` and ``flask-caching<2.5``), then this checkout with ``--no-deps`` (editable: the
SQLAlchemy dialect and the engine spec register by entry point and follow the checkout).
:func:`prepare` writes a ``superset_config.py``, creates the metadata database and the ``admin``
user and registers flightstore as a database; :func:`start` runs Superset on a free port and waits
until it answers. A new site's metadata database starts as a copy of :func:`site_template`'s, made
once per venv (``db upgrade`` and ``init``: most of a site's setup, minutes on a loaded machine).
``tests/sqlalchemy_dialect/test_superset.py`` drives Superset through these same functions.

Run as ``python -m flightstore_sqlalchemy.superset_launch [--flightstore URI] [--home DIR]
[--port N]``; it prints the URL and login and runs until Ctrl-C. Runs in flightstore's own
virtualenv (it imports neither Superset nor SQLAlchemy).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ADMIN", "DATABASE_NAME", "REQUIREMENTS", "cached_venv", "main", "prepare", "site_template",
           "start", "superset_python"]

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ["apache-superset==6.1.0", "rich", "cachetools", "flask-caching<2.5",
                "adbc-driver-flightsql>=1.3", "adbc-driver-manager>=1.3"]
ADMIN = ("admin", "admin")  # username, password of the user prepare() creates
DATABASE_NAME = "flightstore"  # the Superset database prepare() registers
_PROJECT_STAMP = ".flightstore-project"  # in the venv: which checkout (and pyproject) it holds


def cached_venv(name: str, requirements: Sequence[str], *, quiet: bool = True) -> Path:
    """A virtualenv with ``requirements``, made once and kept (safe across processes); returns its
    python. Kept under ``<this venv>/clients/<name>-<hash>`` (the hash: the requirements and the
    Python version), or the temporary directory outside a venv. ``quiet`` keeps pip's output
    (returned in the error when it fails); otherwise pip shows its progress."""
    key = hashlib.sha256(json.dumps([list(requirements), sys.version]).encode()).hexdigest()[:12]
    in_venv = sys.prefix != sys.base_prefix
    root = Path(sys.prefix) / "clients" if in_venv else Path(tempfile.gettempdir()) / "flightstore-clients"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{key}"
    python = target / "bin" / "python"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return python
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=120)
        command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements]
        if quiet:
            installed = subprocess.run([*command[:4], "-q", *command[4:]], capture_output=True, text=True,
                                       timeout=1800)
            if installed.returncode != 0:
                raise RuntimeError(f"installing {list(requirements)} failed:\n{installed.stdout}\n{installed.stderr}")
        else:
            subprocess.run(command, check=True, timeout=1800)
        (target / ".complete").write_text("\n".join(requirements))
    return python


def _project_key() -> str:
    """Which checkout, with which pyproject (its entry points register the dialect and spec)."""
    return f"{ROOT}\n{hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()}"


def superset_python(*, quiet: bool = True) -> Path:
    """The python of Superset's cached venv, with this checkout installed in it (``--no-deps``,
    editable); the checkout is installed again when the venv holds another one or its
    ``pyproject.toml`` changed."""
    python = cached_venv("superset", REQUIREMENTS, quiet=quiet)
    stamp = python.parent.parent / _PROJECT_STAMP
    wanted = _project_key()
    if not stamp.exists() or stamp.read_text() != wanted:
        with open(python.parent.parent / ".project.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not stamp.exists() or stamp.read_text() != wanted:
                done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                       "--no-deps", "-e", str(ROOT)], capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise RuntimeError(f"installing {ROOT} into Superset's venv failed:\n{done.stdout}\n{done.stderr}")
                stamp.write_text(wanted)
    return python


def _config(home: Path, settings: Mapping[str, object]) -> Path:
    """``home/superset_config.py``: the metadata database in ``home``, a secret key made once."""
    home.mkdir(parents=True, exist_ok=True)
    key_file = home / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_hex(32))
        key_file.chmod(0o600)
    lines = [f"SECRET_KEY = {key_file.read_text().strip()!r}",
             f"SQLALCHEMY_DATABASE_URI = {'sqlite:///' + str(home / 'superset.db')!r}"]
    lines += [f"{name} = {value!r}" for name, value in settings.items()]
    path = home / "superset_config.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def environment(home: Path) -> dict[str, str]:
    """The environment Superset runs in: its config and home under ``home``, no PYTHON* variables
    of the caller (they would point Superset's python at flightstore's packages)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(SUPERSET_CONFIG_PATH=str(home / "superset_config.py"), FLASK_APP="superset",
               SUPERSET_HOME=str(home / "home"))
    return env


def prepare(python: Path, home: Path, flightstore_uri: str, *, settings: Mapping[str, object] | None = None,
            env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Make ``home`` a Superset site against flightstore at ``flightstore_uri``
    (``flightstore://host:port``): config (with ``settings``), metadata database, the
    :data:`ADMIN` user, roles, and the :data:`DATABASE_NAME` database. A new site's metadata
    database is a copy of :func:`site_template`'s, which had ``db upgrade`` and ``init`` (by the
    same Superset); an existing one gets them again. Runs again harmlessly (an existing admin is
    kept, the database's URI updated). Returns the environment for :func:`start`."""
    _config(home, settings or {})
    new_site = not (home / _METADATA).exists()
    if new_site:
        shutil.copyfile(site_template(python) / _METADATA, home / _METADATA)
    run_env = environment(home)
    run_env.update(env or {})
    username, password = ADMIN
    upgrade, init = ([], []) if new_site else ([_SCHEMA_STEPS[0]], [_SCHEMA_STEPS[1]])
    steps = [*upgrade,
             ["fab", "create-admin", "--username", username, "--firstname", "Ada", "--lastname", "Admin",
              "--email", "admin@example.invalid", "--password", password],
             *init,
             ["set-database-uri", "--database_name", DATABASE_NAME, "--uri", flightstore_uri]]
    _superset_commands(python, home, run_env, steps)
    return run_env


_METADATA = "superset.db"  # a site's metadata database (sqlite), named in its config
# What makes a metadata database Superset's, the same for every site: schema, roles, permissions.
_SCHEMA_STEPS = [["db", "upgrade"], ["init"]]


def site_template(python: Path) -> Path:
    """A site whose metadata database has Superset's schema, roles and permissions (``db upgrade``,
    ``init``) and nothing of a particular site (no user, no database): made once per Superset
    venv, kept in it, safe across processes (a file lock; a build cut short leaves no template).
    :func:`prepare` copies it into a new site. Returns its directory."""
    venv = python.parent.parent
    target = venv / "site-template"
    with open(venv / ".site-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        building = venv / "site-template.building"
        shutil.rmtree(building, ignore_errors=True)
        _config(building, {})
        _superset_commands(python, building, environment(building), _SCHEMA_STEPS)
        shutil.rmtree(target, ignore_errors=True)
        _config(target, {})  # the copy's config names its own database
        shutil.copyfile(building / _METADATA, target / _METADATA)
        shutil.rmtree(building)
        (target / ".complete").write_text("db upgrade, init\n")
    return target


def _superset_commands(python: Path, home: Path, env: Mapping[str, str], steps: list[list[str]]) -> None:
    """``superset <args>`` for each of ``steps``, in one process in ``home``."""
    done = subprocess.run([str(python), "-c", _SUPERSET_COMMANDS, json.dumps(steps)], env=dict(env), cwd=home,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"preparing Superset in {home} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


# `superset <args>` for each step, in one process: importing Superset takes most of a minute.
_SUPERSET_COMMANDS = r"""
import json, sys
from superset.cli.main import superset
for args in json.loads(sys.argv[1]):
    print("superset", *args[:2], flush=True)
    superset.main(args=args, prog_name="superset", standalone_mode=False)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(python: Path, home: Path, env: Mapping[str, str], port: int | None = None, *,
          timeout: float = 240) -> tuple[subprocess.Popen, str]:
    """Run Superset on ``127.0.0.1:port`` (a free port by default), its output in
    ``home/superset.log``; returns the process and its base URL once ``/health`` answers (or
    raises with the log's end). The caller stops the process."""
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    log = home / "superset.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(python.parent / "superset"), "run", "-h", "127.0.0.1", "-p", str(port),
                                    "--with-threads"], env=dict(env), cwd=home, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"superset exited with code {process.returncode}; its log:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return process, base
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"superset did not answer /health within {timeout:.0f} s; its log:\n"
                               f"{log.read_text()[-4000:]}")
        time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def _check_flightstore(uri: str) -> None:
    """Refuse to start Superset without a flightstore to point it at."""
    from pyarrow import flight
    client = flight.FlightClient(uri)
    try:
        client.wait_for_available(timeout=5)
    except Exception:  # noqa: BLE001 - any failure means: nothing answers there
        raise SystemExit(f"no flightstore answers at {uri}: start one first (make run)") from None
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make superset", description=__doc__.split("\n\n")[0])
    parser.add_argument("--flightstore", default="grpc://127.0.0.1:8815", help="the running flightstore")
    parser.add_argument("--home", default="superset-home", help="Superset's site: config, metadata, log")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    args = parser.parse_args(argv)
    _check_flightstore(args.flightstore)
    print("Superset's virtualenv (made once: several minutes the first time)...", flush=True)
    python = superset_python(quiet=False)
    home = Path(args.home).resolve()
    print(f"Preparing Superset in {home} ...", flush=True)
    env = prepare(python, home, "flightstore://" + args.flightstore.split("://", 1)[1])
    process, base = start(python, home, env, args.port)
    print(f"\nSuperset: {base}/  (login {ADMIN[0]} / {ADMIN[1]}; the database '{DATABASE_NAME}' is "
          f"{args.flightstore}; log: {home / 'superset.log'})\nCtrl-C stops it.", flush=True)
    try:
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(process)


if __name__ == "__main__":
    sys.exit(main())
