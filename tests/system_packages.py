"""The Debian packages the suite needs, installed when missing.

``make test`` runs this module before pytest, so a fresh machine gets every package in one apt-get
call, before several test workers start. A test that still finds its package missing (run alone,
outside ``make test``) installs it through :func:`ensure`. That call takes a file lock and waits on
dpkg's own lock, so two workers never race for apt and fail."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

# package -> what shows it is installed (a command on PATH, or an absolute path)
NEEDED: dict[str, str] = {
    "zookeeper": "/usr/share/java/zookeeper.jar",  # cluster mode (tests/cluster)
    "prometheus": "prometheus",  # tests/server/test_metrics.py scrapes a real server
    "chromium": "chromium",  # the Superset and console browser tests
    "chromium-driver": "chromedriver",
    "tmux": "tmux",  # tests/server/test_harlequin.py drives the TUI in a terminal
}
_LOCK = Path("/tmp/flightstore-apt.lock")


def _present(marker: str) -> bool:
    return Path(marker).exists() if marker.startswith("/") else shutil.which(marker) is not None


def missing(packages: list[str] | None = None) -> list[str]:
    return [p for p in (packages or list(NEEDED)) if not _present(NEEDED[p])]


def install(packages: list[str]) -> None:
    """apt-get install ``packages`` (as root, where apt-get exists), one caller at a time."""
    if not packages or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    with _LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        packages = missing(packages)  # another caller may have installed them meanwhile
        if packages:
            subprocess.run(["apt-get", *wait, "update", "-qq"], env=env, capture_output=True, timeout=900,
                           check=False)
            subprocess.run(["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *packages],
                           env=env, capture_output=True, timeout=1800, check=False)


def ensure(*packages: str) -> None:
    """Install what is missing of ``packages``; RuntimeError naming them if that was not possible."""
    install(missing(list(packages)))
    if still := missing(list(packages)):
        raise RuntimeError(f"Debian packages {', '.join(still)} are missing and apt-get could not install "
                           f"them: run `apt-get install {' '.join(still)}` as root")


if __name__ == "__main__":
    wanted = missing()
    if wanted:
        print(f"Installing Debian packages the tests need: {' '.join(wanted)}", flush=True)
        install(wanted)
    if still := missing():
        print(f"warning: still missing {' '.join(still)}; the tests that need them will fail", file=sys.stderr)
