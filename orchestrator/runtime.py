"""The agent's reconcile runtime: every background behaviour of a cluster is a controller on
it (provisioning, recovery, the host, services and GPU watches, on-start checks).

A controller observes, decides and acts in `reconcile(key)`, and says when it wants to run
again (`Result(requeue_after)`; `Result()`: only when woken). The runtime owns the rest:
- the threads: a controller's `workers` of them (controller-runtime's MaxConcurrentReconciles),
  so that a slow step of one controller never delays another and a controller's keys (a
  node each, "node:<name>") run side by side; never one key on two threads at once, and a
  key enqueued while it runs runs again once it ends;
- the wake-ups: Docker events of the cluster (one stream; each controller's `watch` says
  which of its keys an event concerns), `enqueue` and `wake` by anyone (SIGUSR1, a group
  whose step freed capacity), and each key's own requeue time;
- the per-key backoff, one table: a key that failed (`Result.failed()`, or an error of the
  outside world, errors.TRANSIENT) runs again after its controller's `backoff[n]`, n its
  failures in a row; a success forgets them;
- the failure policy (docs/architecture.md): anything else is a bug, reported once per
  signature (errors.report_bug) and the key is parked until `reset` (the agent resets on
  a spec change) or a restart: never retried in a tight loop.

What a controller decides from lives in SQLite and Docker, not here: the runtime's tables are
only when to look next, and a restart starts every key at once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import TRANSIENT, EngineError, EngineUnavailable, EventLog, bug_signature, report_bug

log = logging.getLogger("hp.runtime")

BACKOFF_S = (2.0, 5.0, 15.0, 30.0)  # the default sequence; a controller may declare its own
EVENTS_RECONNECT_S = 1.0


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the runtime: run again after `requeue_after` seconds (None:
    only when woken); `failed`: back off (the runtime's table decides how long)."""

    requeue_after: float | None = None
    failed: bool = False

    @classmethod
    def backoff(cls) -> Result:
        return cls(failed=True)


NODE = "node:"  # a controller's key for one node: "node:<name>"


def node_key(node: str) -> str:
    return NODE + node


def node_of(key: str | None) -> str | None:
    """The node a key is for (None: not a node's key)."""
    return key[len(NODE) :] if key and key.startswith(NODE) else None


class Controller:
    """One background behaviour. Subclasses set `kind` (and `backoff`, `keys`, `workers`)
    and write `reconcile`; `watch` and `close` are optional. `runtime` is the runtime it was
    added to."""

    kind = "controller"
    keys: tuple[str, ...] = ("",)  # reconciled when the runtime starts
    backoff: tuple[float, ...] = BACKOFF_S
    workers = 1  # keys of this controller reconciled at once, each on a thread of the runtime's
    runtime: Runtime | None = None

    def offer(self, key: str) -> bool:
        """`key` now, unless it runs, waits its turn or is parked (Runtime.offer)."""
        assert self.runtime is not None, f"{self.kind} is on no runtime"
        return self.runtime.offer(self.kind, key)

    def enqueue(self, key: str, after: float = 0.0) -> None:
        """`key` within `after` seconds, after its run if it runs now (Runtime.enqueue)."""
        assert self.runtime is not None, f"{self.kind} is on no runtime"
        self.runtime.enqueue(self.kind, key, after)

    def reconcile(self, key: str) -> Result:  # pragma: no cover - every controller writes its own
        raise NotImplementedError

    def describe(self, key: str) -> str:
        """What a bug report says ran ("internal error in ...")."""
        return f"{self.kind} of {key}" if key else self.kind

    def watch(self, event: Any) -> Iterable[str]:
        """The keys a Docker event of the cluster concerns (run on the events thread: quick)."""
        return ()

    def close(self) -> None:
        """Let go of what it holds (streams, threads) as the runtime stops."""


class Runtime:
    def __init__(
        self,
        store: EventLog | None,
        cluster: str,
        events: Callable[[], Iterable[Any]] | None = None,
        stop: threading.Event | None = None,
    ):
        self.store, self.cluster, self._events = store, cluster, events
        self.stop = stop or threading.Event()
        self._lock = threading.RLock()  # re-entrant: woken from signal handlers
        self._cv: dict[str, threading.Condition] = {}
        self._ctrls: dict[str, Controller] = {}
        self._due: dict[tuple[str, str], float] = {}  # key -> when it runs next (monotonic)
        self._failures: dict[tuple[str, str], int] = {}
        self._parked: dict[tuple[str, str], str] = {}  # key -> the signature of the bug that parked it
        self._running: set[tuple[str, str]] = set()  # keys being reconciled now
        self._ended: dict[tuple[str, str], float] = {}  # key -> when its last reconcile ended (wall clock)
        self._threads: list[threading.Thread] = []

    # -- controllers and their keys --------------------------------------------------
    def add(self, c: Controller) -> Controller:
        with self._lock:
            self._ctrls[c.kind] = c
            c.runtime = self
        for k in c.keys:
            self.enqueue(c.kind, k)
        return c

    def enqueue(self, ctrl: str, key: str, after: float = 0.0) -> None:
        """Reconcile `key` of `ctrl` within `after` seconds (an earlier time already set stays;
        a controller not added yet finds it when it is)."""
        with self._lock:
            self._enqueue_locked((ctrl, key), after)

    def offer(self, ctrl: str, key: str) -> bool:
        """Reconcile `key` now unless it runs, waits its turn (a requeue, a backoff) or is
        parked: for observers that look again anyway. Returns whether it was enqueued."""
        with self._lock:
            k = (ctrl, key)
            if k in self._running or k in self._due or k in self._parked:
                return False
            self._enqueue_locked(k, 0.0)
            return True

    def wake(self, ctrl: str | None = None) -> None:
        """Every known key of `ctrl` (of every controller: None) now."""
        with self._lock:
            for c, k in list(self._due):
                if ctrl in (None, c):
                    self._due[(c, k)] = 0.0
            for c in self._cv if ctrl is None else (ctrl,):
                self._cond(c).notify_all()

    def forget(self, ctrl: str, key: str) -> None:
        """A key that no longer exists (a group removed from the spec)."""
        with self._lock:
            for table in (self._due, self._failures, self._parked, self._ended):
                table.pop((ctrl, key), None)

    def reset(self, ctrl: str) -> None:
        """What `ctrl` was told by its failures is stale (the spec changed): its parked keys
        and backoffs are forgotten and every key runs now."""
        with self._lock:
            for k in [k for k in self._parked if k[0] == ctrl]:
                del self._parked[k]
                self._due[k] = 0.0
            for k in [k for k in self._failures if k[0] == ctrl]:
                del self._failures[k]
        self.wake(ctrl)

    def parked(self, ctrl: str) -> set[str]:
        with self._lock:
            return {k for c, k in self._parked if c == ctrl}

    def failures(self, ctrl: str, key: str) -> int:
        with self._lock:
            return self._failures.get((ctrl, key), 0)

    def due_in(self, ctrl: str, key: str) -> float | None:
        """Seconds until `key` runs (None: only when woken)."""
        with self._lock:
            at = self._due.get((ctrl, key))
            return None if at is None else at - time.monotonic()

    def ended(self, ctrl: str, key: str) -> float:
        """When the last reconcile of `key` ended (wall clock; 0.0: never)."""
        with self._lock:
            return self._ended.get((ctrl, key), 0.0)

    def idle(self, ctrl: str, timeout: float) -> bool:
        """Wait until no key of `ctrl` runs or is due now (parked ones aside); False after
        `timeout` seconds."""
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.monotonic()
                busy = any(c == ctrl for c, _ in self._running) or any(
                    c == ctrl and at <= now and (c, k) not in self._parked for (c, k), at in self._due.items()
                )
                if not busy:
                    return True
                if now >= end:
                    return False
                self._cond(ctrl).wait(min(0.05, end - now))

    # -- running ---------------------------------------------------------------------
    def start(self) -> Runtime:
        for name, c in list(self._ctrls.items()):
            for i in range(max(1, c.workers)):
                t = threading.Thread(target=self._serve, args=(name,), daemon=True, name=f"{name}-{i}" if i else name)
                t.start()
                self._threads.append(t)
        if self._events is not None:
            threading.Thread(target=self._watch, daemon=True, name="events").start()
        return self

    def shutdown(self, join_s: float = 5.0) -> None:
        self.stop.set()
        self.wake()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(join_s)
        for c in self._ctrls.values():
            c.close()

    def _take(self, ctrl: str) -> str | None:
        """The key of `ctrl` due the longest, once there is one that no other thread runs
        (waits for it), marked running; None once stopped."""
        with self._lock:
            while not self.stop.is_set():
                now = time.monotonic()
                mine = [
                    (at, k)
                    for (c, k), at in self._due.items()
                    if c == ctrl and (c, k) not in self._parked and (c, k) not in self._running
                ]
                if mine and (first := min(mine))[0] <= now:
                    del self._due[(ctrl, first[1])]
                    self._running.add((ctrl, first[1]))
                    return first[1]
                self._cond(ctrl).wait(min((at for at, _ in mine), default=now + 60.0) - now)
        return None

    def _serve(self, ctrl: str) -> None:
        c = self._ctrls[ctrl]
        while (key := self._take(ctrl)) is not None:
            try:
                if not self.stop.is_set():
                    self.run_once(c, key)
            finally:
                with self._lock:
                    self._running.discard((ctrl, key))
                    self._cond(ctrl).notify_all()  # a key enqueued while it ran may run now

    def run_once(self, c: Controller, key: str) -> Result | None:
        """One reconcile of `key`, its outcome applied (the unit tests call it directly)."""
        k = (c.kind, key)
        r, ok = self._attempt(c, key, lambda: c.reconcile(key))
        with self._lock:
            self._ended[k] = time.time()
            if k in self._parked:
                return None
            if not ok or r.failed:
                n = self._failures.get(k, 0)
                self._failures[k] = n + 1
                self._enqueue_locked(k, c.backoff[min(n, len(c.backoff) - 1)])
                return r or Result.backoff()
            self._failures.pop(k, None)
            if r.requeue_after is not None:
                self._enqueue_locked(k, r.requeue_after)
        return r

    def _attempt(self, c: Controller, key: str | None, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """fn() under the failure policy: (its value, True), or (None, False) after an error
        of the outside world (logged) or a bug: reported once per signature and, for a key
        (None: a Docker event), that key parked."""
        try:
            return fn(), True
        except TRANSIENT as e:
            log.warning("%s: %s", c.describe(key or ""), e)
        except Exception as e:  # noqa: BLE001 - a bug: reported once, its key parked until reset or restart
            sig = bug_signature(e)
            with self._lock:
                first = key is None or self._parked.get((c.kind, key)) != sig
                if key is not None:
                    self._parked[(c.kind, key)] = sig
            if first:
                report_bug(
                    self.store,
                    self.cluster,
                    c.describe(key) if key is not None else f"{c.kind}, on a Docker event",
                    e,
                    log,
                    node=node_of(key),
                )
        return None, False

    def _enqueue_locked(self, k: tuple[str, str], after: float) -> None:
        at = time.monotonic() + after
        if k not in self._due or self._due[k] > at:
            self._due[k] = at
        self._cond(k[0]).notify_all()

    def _cond(self, ctrl: str) -> threading.Condition:
        return self._cv.setdefault(ctrl, threading.Condition(self._lock))

    def _watch(self) -> None:
        """The cluster's Docker events: each controller is told, and the keys it names run now."""
        assert self._events is not None
        while not self.stop.is_set():
            try:
                for ev in self._events():
                    if self.stop.is_set():
                        return
                    for c in list(self._ctrls.values()):
                        keys, _ = self._attempt(c, None, lambda c=c, ev=ev: list(c.watch(ev)))
                        for key in keys or ():
                            self.enqueue(c.kind, key)
            except (EngineError, EngineUnavailable) as e:  # the engine restarted or the stream broke: reconnect
                if not self.stop.is_set():
                    log.info("event stream of %s: %s", self.cluster, e)
            self.stop.wait(EVENTS_RECONNECT_S)
