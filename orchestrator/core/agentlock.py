"""A cluster's agent is alive while it holds the cluster's lock file: its files, and the
look that tells whether one holds it. Apart from agents.py (which starts and stops
agents) and light (fcntl, os, pathlib), for the quick `hp exec` (cli/quick.py)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from ..state.home import cluster_folder


def paths(home: Path, name: str) -> tuple[Path, Path, Path]:
    """The agent's lock, pid and log files (the cluster's folder made if missing)."""
    d = cluster_folder(home, name)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d / "agent.lock", d / "agent.pid", d / "agent.log"


def holder(home: Path, name: str) -> int | None:
    """The live agent's pid, or None when no agent holds the lock (-1: alive, pid unknown)."""
    lock, pidf, _ = paths(home, name)
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(pidf.read_text().strip())
            except (OSError, ValueError):
                return -1
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
