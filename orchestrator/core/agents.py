"""Process control of the per-cluster agents (used by the CLI and the library): start one
when none runs, wake it, stop it, and the lock `hp create` holds meanwhile.

One agent process per cluster (`python -m orchestrator.agent NAME`). Alive means: it
holds the cluster's lock file.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import waits
from ..state.home import hp_home
from ..state.store import Store
from ..state.transitions import ENDING
from .agentlock import holder, paths

KILLED_WAIT_S = 1.0  # for a SIGKILLed agent to be gone (its lock released)


class AgentProcesses:
    """The Agents interface (core/context.py) on real processes."""

    def __init__(self, store: Store | None = None):
        self._store = store

    def _home(self) -> Path:
        return self._store.home if self._store is not None else hp_home()

    @contextmanager
    def creation_lock(self, name: str) -> Iterator[None]:
        """Held by `hp create` while it makes the cluster: an agent started meanwhile (by
        `hp nodes` in another terminal) would see it as alive and not start."""
        lock, _, _ = paths(self._home(), name)
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def pid(self, name: str) -> int | None:
        """The live agent's pid, or None (-1: alive, pid unknown)."""
        return holder(self._home(), name)

    def ensure(self, name: str) -> dict[str, Any]:
        """Start the cluster's agent if it is not running. Returns its status."""
        store = self._store or Store()
        row = store.cluster(name)
        if row is None or row.status in ENDING:
            return {"Alive": False, "Pid": None, "Restarted": False}
        pid = self.pid(name)
        if pid is not None:
            return {"Alive": True, "Pid": pid, "Restarted": False}
        _, _, logf = paths(self._home(), name)
        with open(logf, "ab") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.agent", name],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                env={**os.environ, "HP_HOME": str(self._home())},
            )
        return {"Alive": True, "Pid": p.pid, "Restarted": True}

    def poke(self, name: str) -> None:
        """Wake the agent now (after a spec change)."""
        pid = self.pid(name)
        if pid and pid > 0:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def stop(self, name: str, timeout: float = 10.0) -> None:
        pid = self.pid(name)
        if not pid or pid < 0:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return

        def gone() -> bool:
            return self.pid(name) is None

        if not waits.poll(gone, every=0.05, timeout=timeout):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            waits.poll(gone, every=0.05, timeout=KILLED_WAIT_S)
