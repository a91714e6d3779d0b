"""The Debian packages the suite needs, installed when missing.

``make test`` runs this module before pytest, so a fresh machine gets every package in one apt-get
call, before several test workers start. A test that still finds its package missing (run alone,
outside ``make test``) installs it through :func:`ensure` (:mod:`flightstore.debian`: one installer
at a time, waiting on dpkg's own lock), so two workers never race for apt and fail."""

from __future__ import annotations

import sys

from flightstore import debian

# package -> what shows it is installed (a command on PATH, or an absolute path)
NEEDED: dict[str, str] = {
    "zookeeper": "/usr/share/java/zookeeper.jar",  # cluster mode (tests/cluster)
    "prometheus": "prometheus",  # tests/server/test_metrics.py scrapes a real server
    "chromium": "chromium",  # the Superset and console browser tests
    "chromium-driver": "chromedriver",
    "tmux": "tmux",  # tests/server/test_harlequin.py drives the TUI in a terminal
}


def ensure(*packages: str) -> None:
    """Install what is missing of ``packages``; RuntimeError naming them if that was not possible."""
    if still := debian.install({package: NEEDED[package] for package in packages}):
        raise RuntimeError(f"Debian packages {', '.join(still)} are missing and apt-get could not install "
                           f"them: run `apt-get install {' '.join(still)}` as root")


if __name__ == "__main__":
    if wanted := debian.missing(NEEDED):
        print(f"Installing Debian packages the tests need: {' '.join(wanted)}", flush=True)
    if still := debian.install(NEEDED):
        print(f"warning: still missing {' '.join(still)}; the tests that need them will fail", file=sys.stderr)
