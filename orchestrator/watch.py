"""Automatic node recovery: watch a cluster's containers (Docker events, at once) and
its Slurm node states (a poll every 2 s), and reboot or replace nodes that died.

The decision (what to do for which observed fact) is a literal table of pure data,
`RULES`, unit-tested; the watcher only observes, guards against acting twice or on
nodes someone else handles, and runs each action on a thread of its own.

Run by the per-cluster agent as `RecoveryWatcher(env, name).run(stop)`; standalone
(until SIGTERM) as `python -m orchestrator.watch NAME`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .slurm import SlurmNode

log = logging.getLogger("hp.watch")

POLL_S = 2.0
# Phases (lifecycle.py) in which someone else owns the node: the health checks, a
# removal, or the agent's reconciler (launching, retrying a failed launch).
OWNED_STATUSES = ("DeepHealthCheckInProgress", "ShuttingDown", "Removed", "Queued", "Launching", "LaunchFailed")
# Phases of a recovery in progress in some hp process (`hp reboot`, the health checks,
# a watcher); older than ACTING_OWNED_S, a leftover of a process that died.
ACTING_STATUSES = ("Rebooting", "Replacing", "Pending")
ACTING_OWNED_S = 180.0
LOST_AFTER_S = 15.0  # a running worker unknown to Slurm this long is lost (registration takes ~0.5 s)
# Cluster statuses in which the watcher leaves nodes alone: create and delete own them.
HANDS_OFF_CLUSTER = ("Creating", "Deleting", "RollingBack", "Failed")
BACKOFF_S = (30.0, 60.0, 120.0, 300.0)  # after a failed recovery, before trying that node again

# -- actions -------------------------------------------------------------------------
NONE = "none"
REBOOT = "reboot"
REPLACE = "replace"
RECOVER = "recover"  # reboot, then replace if it does not come back

# -- observed facts ------------------------------------------------------------------
# Container: running | died (exited/dead) | starting (created/restarting/paused/removing) | missing
# Slurm:     ok | absent (no record) | lost (no record for LOST_AFTER_S) | action_reboot | action_replace | admin_hold | not_responding
ANY = "*"

# (role, container, slurm) -> (action, only when NodeRecovery is Automatic). First match wins.
RULES: tuple[tuple[tuple[str, str, str], tuple[str, bool]], ...] = (
    # An admin asked through Slurm (state=fail reason=Action:...): an explicit request,
    # honoured whatever NodeRecovery says.
    ((ANY, ANY, "action_replace"), (REPLACE, False)),
    ((ANY, ANY, "action_reboot"), (REBOOT, False)),
    # Drained/down/failed by someone for a reason of their own: theirs to handle.
    ((ANY, ANY, "admin_hold"), (NONE, False)),
    # No container: removed on purpose (scale-down, delete) or by someone; not a fault
    # hp observed. Provisioning restores counts, not recovery.
    ((ANY, "missing", ANY), (NONE, False)),
    # Being created or restarted right now: wait for the outcome.
    ((ANY, "starting", ANY), (NONE, False)),
    # The controller's state is on a named volume: restart it, never replace it.
    (("controller", "died", ANY), (REBOOT, True)),
    # A worker or login container died (killed, OOM, slurmd/sackd exited): reboot, then replace.
    ((ANY, "died", ANY), (RECOVER, True)),
    # The container runs but Slurm says slurmd stopped answering (DOWN / NOT_RESPONDING).
    (("worker", "running", "not_responding"), (RECOVER, True)),
    # The container runs but Slurm has had no record of it for LOST_AFTER_S: a controller
    # restart forgot it (state not saved), and slurmd only registers when it starts.
    (("worker", "running", "lost"), (RECOVER, True)),
    # Everything else is healthy, or not hp's to judge.
    ((ANY, ANY, ANY), (NONE, False)),
)


def decide(role: str, container: str, slurm: str, automatic: bool) -> str:
    """The action for a node's observed facts (see RULES)."""
    for (r, c, s), (action, needs_auto) in RULES:
        if r in (ANY, role) and c in (ANY, container) and s in (ANY, slurm):
            return NONE if needs_auto and not automatic else action
    return NONE


def container_condition(state: str | None) -> str:
    """Docker's container state, as the table reads it."""
    if state is None:
        return "missing"
    if state == "running":
        return "running"
    if state in ("exited", "dead"):
        return "died"
    return "starting"


def slurm_condition(n: SlurmNode | None) -> str:
    """Slurm's view of a node, as the table reads it."""
    if n is None:
        return "absent"
    held = n.base == "DOWN" or bool({"FAIL", "DRAIN"} & n.flags)
    # Slurm keeps the reason after a resume: only a node still held is asking for action.
    if held and n.reason.startswith("Action:Replace"):
        return "action_replace"
    if held and n.reason.startswith("Action:Reboot"):
        return "action_reboot"
    if held and n.reason and not n.reason.startswith(SLURM_OWN_REASONS):
        return "admin_hold"
    if n.not_responding:
        return "not_responding"
    return "ok"


# Reasons Slurm itself sets on a node that stops answering or comes back unasked.
SLURM_OWN_REASONS = ("Not responding", "Node unexpectedly rebooted",
                     "hp-health:")  # hp's own drains (health checks, on-start): not an admin's hold


@dataclass(frozen=True)
class Seen:
    """One node as observed at `at` (wall clock), with the reason words for events."""

    node: str
    role: str
    container: str
    slurm: str
    at: float
    why: str


def guard(seen: Seen, recorded: tuple[str, str, float] | None, busy: bool, last_done: float,
          retry_at: float, now: float) -> str | None:
    """Why not to act on an observation (None: go ahead). Pure."""
    if busy:
        return "an action on it is in progress here"
    if seen.at < last_done:
        return "observed before the last action on it ended"
    if now < retry_at:
        return "backing off after a failed recovery"
    if recorded is not None:
        status, _, t = recorded
        if status in OWNED_STATUSES:
            return f"it is {status}"
        if t > seen.at:
            return "its status changed after the observation"
        if status in ACTING_STATUSES and now - t < ACTING_OWNED_S:
            return "another hp operation is launching or recovering it"
    return None


def describe_fact(seen_container: str, snode: SlurmNode | None, exit_code: int | None, oom: bool) -> str:
    """Words for the event: why hp acts."""
    if snode is not None and snode.reason.startswith(("Action:Reboot", "Action:Replace")):
        return f"requested through Slurm ({snode.reason})"
    if seen_container == "died":
        extra = " (out of memory)" if oom else ""
        return f"container died (exit {exit_code if exit_code is not None else '?'}){extra}"
    if snode is not None:
        return f"Slurm reports {snode.display}" + (f": {snode.reason}" if snode.reason else "")
    return "node failed"


class RecoveryWatcher:
    """Watches one cluster and recovers its nodes; one thread per node action."""

    def __init__(self, env: Any, name: str, wait: float = 60.0,
                 act: Callable[[Any, str, str, str, float], bool] | None = None):
        from .cluster import Cluster

        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.wait = wait
        self._act_fn = act or _act
        self._lock = threading.Lock()
        self._busy: dict[str, threading.Thread] = {}
        self._last_done: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._snodes: dict[str, SlurmNode] = {}
        self._oom: set[str] = set()
        self._absent_since: dict[str, float] = {}  # running workers Slurm has no record of
        self._stream: Any = None  # the open Docker event stream, closed on stop

    # -- main loop -----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set or the cluster is deleted."""
        events = threading.Thread(target=self._events_loop, args=(stop,), name=f"hp-watch-events-{self.name}",
                                  daemon=True)
        events.start()
        while not stop.is_set():
            try:
                if not self.poll():
                    break
            except Exception as e:  # noqa: BLE001 - an engine hiccup must not end the watch
                log.warning("poll of %s failed: %s", self.name, e)
            stop.wait(POLL_S)
        stop.set()
        self._close_stream()
        for t in list(self._busy.values()):
            t.join(timeout=self.wait)

    def poll(self) -> bool:
        """One look at Docker and Slurm; act where the table says. False once the cluster is gone."""
        row = self.env.store.cluster(self.name)
        if row is None:
            return False
        if row.status in HANDS_OFF_CLUSTER:
            return True
        automatic = self.cluster.reload().NodeRecovery == "Automatic"
        at = time.time()
        containers = self.cluster.node_containers()
        ctl = containers.get(self.cluster.controller_host)
        snodes: dict[str, SlurmNode] = {}
        answered = False
        if ctl is not None and ctl.state == "running":
            try:
                snodes = {n.name: n for n in self.cluster.slurm.nodes()}
                answered = True
            except Exception as e:  # noqa: BLE001 - the controller may be restarting
                log.info("Slurm of %s did not answer: %s", self.name, e)
        with self._lock:
            self._snodes = snodes
        recorded = self.env.store.latest_node_status(self.name)
        from .cluster import role_of

        for node in sorted(set(containers) | set(snodes)):
            c = containers.get(node)
            role = role_of(c) if c else "worker"  # Slurm knows only workers
            cond = container_condition(c.state if c else None)
            sn = snodes.get(node)
            why = describe_fact(cond, sn, c.exit_code if c else None, node in self._oom)
            scond = self._lost(node, slurm_condition(sn), at, answered and role == "worker")
            if scond == "lost":
                why = f"Slurm has no record of it for {LOST_AFTER_S:g} s"
            self.consider(Seen(node, role, cond, scond, at, why), automatic, recorded.get(node))
        return True

    def _lost(self, node: str, cond: str, at: float, counts: bool) -> str:
        """A worker's 'absent' becomes 'lost' once it lasted LOST_AFTER_S (`counts`: a
        worker, and Slurm answered)."""
        if cond != "absent" or not counts:
            self._absent_since.pop(node, None)
            return cond
        since = self._absent_since.setdefault(node, at)
        return "lost" if at - since >= LOST_AFTER_S else cond

    def on_event(self, ev: dict[str, Any]) -> None:
        """A Docker container event: 'die' means the node's main process ended."""
        from .naming import L_NODE, L_ROLE

        status = ev.get("status") or ev.get("Action")
        attrs = (ev.get("Actor") or {}).get("Attributes") or {}
        node, role = attrs.get(L_NODE), attrs.get(L_ROLE)
        if not node or role not in ("controller", "login", "worker"):
            return
        if status == "oom":
            with self._lock:
                self._oom.add(node)  # the 'die' that follows says why
            return
        if status != "die":
            return
        row = self.env.store.cluster(self.name)
        if row is None or row.status in HANDS_OFF_CLUSTER:
            return
        automatic = self.cluster.reload().NodeRecovery == "Automatic"
        at = ev.get("timeNano", 0) / 1e9 or float(ev.get("time", time.time()))
        code = attrs.get("exitCode")
        with self._lock:
            sn = self._snodes.get(node)
            oom = node in self._oom
        if role == "worker":  # Slurm's view now, not at the last poll: an admin may have drained it since
            try:
                sn = next((n for n in self.cluster.slurm.nodes() if n.name == node), None)
            except Exception as e:  # noqa: BLE001 - the controller may be down too: use the last poll's
                log.info("Slurm of %s did not answer: %s", self.name, e)
        why = describe_fact("died", sn, int(code) if code and code.lstrip("-").isdigit() else None, oom)
        seen = Seen(node, role, "died", slurm_condition(sn), at, why)
        self.consider(seen, automatic, self.env.store.latest_node_status(self.name).get(node))

    def consider(self, seen: Seen, automatic: bool, recorded: tuple[str, str, float] | None) -> None:
        action = decide(seen.role, seen.container, seen.slurm, automatic)
        if action == NONE:
            return
        with self._lock:
            t = self._busy.get(seen.node)
            busy = t is not None and t.is_alive()
            why_not = guard(seen, recorded, busy, self._last_done.get(seen.node, 0.0),
                            self._retry_at.get(seen.node, 0.0), time.time())
            if why_not:
                log.debug("%s: not acting (%s): %s", seen.node, action, why_not)
                return
            t = threading.Thread(target=self._run_action, args=(seen, action), daemon=True,
                                 name=f"hp-recover-{self.name}-{seen.node}")
            self._busy[seen.node] = t
            t.start()
        log.info("%s: %s (%s)", seen.node, action, seen.why)

    def _run_action(self, seen: Seen, action: str) -> None:
        try:
            ok = self._act_fn(self.cluster, action, seen.node, seen.why, self.wait)
        except Exception as e:  # noqa: BLE001 - report, back off, keep watching
            log.warning("%s of %s failed: %s", action, seen.node, e)
            ok = False
        with self._lock:
            self._last_done[seen.node] = time.time()
            self._oom.discard(seen.node)
            if ok:
                self._failures.pop(seen.node, None)
                self._retry_at.pop(seen.node, None)
            else:
                n = self._failures.get(seen.node, 0)
                self._failures[seen.node] = n + 1
                self._retry_at[seen.node] = time.time() + BACKOFF_S[min(n, len(BACKOFF_S) - 1)]

    # -- Docker events -------------------------------------------------------------------
    def _events_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._stream = self.env.provider.events(self.name)
                for ev in _until(self._stream, stop):
                    self.on_event(ev)
            except Exception as e:  # noqa: BLE001 - the engine restarted or the stream broke: reconnect
                if not stop.is_set():
                    log.info("event stream of %s broke: %s", self.name, e)
            stop.wait(1.0)

    def _close_stream(self) -> None:
        s = self._stream
        if s is not None and hasattr(s, "close"):
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                pass


def _until(stream: Iterable[dict[str, Any]], stop: threading.Event) -> Iterable[dict[str, Any]]:
    for ev in stream:
        if stop.is_set():
            return
        yield ev


def _act(cluster: Any, action: str, node: str, why: str, wait: float) -> bool:
    from . import recovery

    fn = {REBOOT: recovery.reboot, REPLACE: recovery.replace, RECOVER: recovery.recover}[action]
    return fn(cluster, node, why, wait)


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.watch NAME`: watch until SIGTERM/SIGINT."""
    import argparse
    import signal

    from .cluster import Env

    ap = argparse.ArgumentParser(prog="python -m orchestrator.watch", description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    env = Env()
    if env.store.cluster(args.name) is None:
        log.error("cluster %r does not exist", args.name)
        return 2
    RecoveryWatcher(env, args.name).run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
