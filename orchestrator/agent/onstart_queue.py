"""The agent's queue of new nodes to check before they take jobs (groups with
OnStartDeepHealthChecks): a controller (orchestrator/runtime.py) that checks them in
batches (one health-check request per cluster at a time)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..runtime import Controller, Result

RETRY_BUSY_S = 5.0
GATHER_S = 1.0  # nodes that joined together are checked together
BATCH = "batch"


class OnStartQueue(Controller):
    kind = "on-start"
    keys = ()

    def __init__(
        self,
        check: Callable[[list[str]], object],
        busy: type[BaseException],
        on_error: Callable[[list[str], BaseException], None],
    ):
        self.check, self.busy, self.on_error = check, busy, on_error
        self._nodes: list[str] = []
        self._pending: set[str] = set()  # queued or being checked: never twice
        self._lock = threading.Lock()

    def add(self, node: str) -> None:
        with self._lock:
            if node in self._pending:
                return
            self._pending.add(node)
            self._nodes.append(node)
        self.enqueue(BATCH, GATHER_S)

    def reconcile(self, key: str = BATCH) -> Result:
        """Check the queued batch."""
        with self._lock:
            batch, self._nodes = self._nodes, []
        if not batch:
            return Result()
        try:
            self.check(batch)
        except self.busy:  # an on-demand check is running: try again soon
            with self._lock:
                self._nodes = batch + self._nodes
            return Result(RETRY_BUSY_S)
        except Exception as e:  # noqa: BLE001 - reported by on_error (a bug as a bug); the nodes stay drained: safe
            self.on_error(batch, e)
        with self._lock:
            self._pending -= set(batch)
        return Result()
