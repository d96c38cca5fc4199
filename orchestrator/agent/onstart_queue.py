"""The agent's queue of new nodes to check before they take jobs (groups with
OnStartDeepHealthChecks), checked in batches on one thread (one health-check request
per cluster at a time)."""

from __future__ import annotations

import threading
from collections.abc import Callable

RETRY_BUSY_S = 5.0
GATHER_S = 1.0  # nodes that joined together are checked together


class OnStartQueue:
    def __init__(
        self,
        check: Callable[[list[str]], object],
        busy: type[BaseException],
        on_error: Callable[[list[str], BaseException], None],
        stop: threading.Event,
    ):
        self.check, self.busy, self.on_error, self.stop = check, busy, on_error, stop
        self._nodes: list[str] = []
        self._pending: set[str] = set()  # queued or being checked: never twice
        self._cv = threading.Condition()

    def start(self) -> OnStartQueue:
        threading.Thread(target=self._run, daemon=True, name="on-start-checks").start()
        return self

    def add(self, node: str) -> None:
        with self._cv:
            if node in self._pending:
                return
            self._pending.add(node)
            self._nodes.append(node)
            self._cv.notify()

    def take(self) -> list[str]:
        with self._cv:
            batch, self._nodes = self._nodes, []
        return batch

    def run_once(self) -> None:
        """Check the queued batch (a unit of work; the thread loops over it)."""
        batch = self.take()
        if not batch:
            return
        try:
            self.check(batch)
        except self.busy:  # an on-demand check is running: try again soon
            self.stop.wait(RETRY_BUSY_S)
            with self._cv:
                self._nodes = batch + self._nodes
            return
        except Exception as e:  # noqa: BLE001 - reported by on_error (a bug as a bug); the nodes stay drained: safe
            self.on_error(batch, e)
        with self._cv:
            self._pending -= set(batch)

    def _run(self) -> None:
        while not self.stop.is_set():
            with self._cv:
                while not self._nodes and not self.stop.is_set():
                    self._cv.wait(5)
            self.stop.wait(GATHER_S)
            self.run_once()
