"""A cluster's agent is alive while it holds the cluster's lock file: its files, and the
look that tells whether one holds it. Apart from agents.py (which starts and stops
agents) and light (fcntl and os: paths as strings), for the quick `hp exec` (cli/quick.py)."""

from __future__ import annotations

import fcntl
import os
import time

from ..state.home import cluster_dir, cluster_folder
from .procs import alive

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO

FILES = ("agent.lock", "agent.pid", "agent.log")

# The agent (and `hp create`) hold the lock exclusively; a look (`holder`) holds it shared
# for a moment. An agent that finds it held shared waits for the look to end (this long
# at most: a look is a few microseconds, more only on a starved machine), not leaves.
LOOK_WAIT_S = 5.0


def _files(home: str | os.PathLike[str], name: str) -> list[str]:
    d = cluster_dir(home, name)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return [os.path.join(d, f) for f in FILES]


def paths(home: Path, name: str) -> tuple[Path, Path, Path]:
    """The agent's lock, pid and log files (the cluster's folder made if missing)."""
    _files(home, name)
    d = cluster_folder(home, name)
    return d / FILES[0], d / FILES[1], d / FILES[2]


def take(home: str | os.PathLike[str], name: str) -> IO[str] | None:
    """Take the cluster's lock for this process, the agent (and write its pid): the open
    lock file, to be held as long as the process runs; None when another agent (or a
    create) holds it. A look that holds it shared for a moment is waited out: an agent
    that left because someone looked would leave the cluster with none."""
    lock, pidf, _ = _files(home, name)
    f = open(lock, "a+")  # noqa: SIM115 (held until the process ends)
    deadline = time.monotonic() + LOOK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            pass
        try:  # held: shared (a look, which ends) or exclusive (an agent, which does not)?
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        fcntl.flock(f, fcntl.LOCK_UN)
        if time.monotonic() > deadline:
            f.close()
            return None
        time.sleep(0.001)
    with open(pidf, "w") as p:
        p.write(str(os.getpid()))
    return f


def holder(home: str | os.PathLike[str], name: str) -> int | None:
    """The live agent's pid, or None when no agent holds the lock (-1: alive, pid unknown:
    not written yet, or still its predecessor's, dead: never a pid to signal)."""
    # a look holds the lock shared: looks at once never take each other for an agent
    lock, pidf, _ = _files(home, name)
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                with open(pidf) as p:
                    pid = int(p.read().strip())
            except (OSError, ValueError):
                return -1
            # a dead process's pid: the last agent's, which the one that holds the lock now has
            # not written over yet (take() writes its pid once it holds the lock)
            return pid if alive(pid) else -1
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
