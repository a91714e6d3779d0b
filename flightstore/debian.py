"""Debian packages a feature needs (ZooKeeper for cluster mode; the test suite's browser, Prometheus
and tmux), installed with apt-get when missing and this process may (root, apt-get present).

Several processes may ask at once (a cluster's servers, the test workers): one installs at a time
under a file lock, re-checks what is still missing once it holds it, and waits on dpkg's own lock
rather than failing when another apt-get runs."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["install", "missing"]

_LOCK = Path("/tmp/flightstore-apt.lock")
_WAIT = ["-o", "DPkg::Lock::Timeout=600"]


def _present(marker: str) -> bool:
    return Path(marker).exists() if marker.startswith("/") else shutil.which(marker) is not None


def missing(markers: Mapping[str, str]) -> list[str]:
    """The packages of ``markers`` (package -> a command on PATH or an absolute path that shows it
    is installed) that are not installed."""
    return [package for package, marker in markers.items() if not _present(marker)]


def install(markers: Mapping[str, str]) -> list[str]:
    """apt-get install what is missing of ``markers``, one caller at a time; the packages still
    missing afterwards (all of them when this process may not install: not root, no apt-get)."""
    if not missing(markers) or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return missing(markers)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with _LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        packages = missing(markers)  # another caller may have installed them meanwhile
        if packages:
            subprocess.run(["apt-get", *_WAIT, "update", "-qq"], env=env, capture_output=True, timeout=900,
                           check=False)
            subprocess.run(["apt-get", *_WAIT, "install", "-y", "-qq", "--no-install-recommends", *packages],
                           env=env, capture_output=True, timeout=1800, check=False)
    return missing(markers)
