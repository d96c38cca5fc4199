"""Automatic node recovery: watch a cluster's containers (Docker events, at once) and its
Slurm node states (a poll every 2 s), and reboot or replace nodes that died.

The decision is rules.py's table; the watcher only observes, guards against acting
twice or on nodes someone else owns, and runs each action on a thread of its own. A
controller of the agent's runtime (orchestrator/runtime.py): its poll is `reconcile`, the
cluster's Docker events reach `watch`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..core.context import Cluster, Env
from ..docker.views import Event
from ..errors import TRANSIENT, EngineError, EngineUnavailable, report_bug
from ..runtime import Controller, Result
from ..slurm.model import DOWN, SlurmNode
from ..state.phases import NodePhase
from ..state.transitions import ClusterStatus
from ..verdict import Action
from . import actions
from .rules import (
    BACKOFF_S,
    LOST_AFTER_S,
    Seen,
    container_condition,
    decide,
    describe_fact,
    guard,
    slurm_condition,
)

log = logging.getLogger("hp.watch")

POLL_S = 2.0
# After hp takes a worker, how long the watcher looks for `srun --auto-resume` retries
# (each one an event): the plugin's --auto-resume-timeout default, and a margin.
RETRY_WATCH_S = 660.0
# Cluster statuses in which the watcher leaves nodes alone: create and delete own them.
HANDS_OFF_CLUSTER = (ClusterStatus.CREATING, ClusterStatus.DELETING, ClusterStatus.ROLLING_BACK, ClusterStatus.FAILED)

Act = Callable[[Cluster, Action, str, str, float], bool]


class RecoveryWatcher(Controller):
    """Watches one cluster and recovers its nodes; one thread per node action."""

    kind = "recovery"
    backoff = (POLL_S,)  # an engine hiccup must not end the watch: the next poll

    def __init__(self, env: Env, name: str, wait: float = 60.0, act: Act | None = None):
        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.wait = wait
        self._act_fn = act or actions.step
        self._lock = threading.Lock()
        self._busy: dict[str, threading.Thread] = {}
        self._last_done: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._snodes: dict[str, SlurmNode] = {}
        self._oom: set[str] = set()
        self._absent_since: dict[str, float] = {}  # running workers Slurm has no record of
        self._retries_until = 0.0  # look for auto-resume retries until then (RETRY_WATCH_S)
        self._retries_seen: set[int] = set()

    # -- the controller ---------------------------------------------------------------
    def reconcile(self, key: str) -> Result:
        """One poll, and the next in POLL_S; none once the cluster is gone."""
        return Result(POLL_S) if self.poll() else Result()

    def watch(self, event: Event) -> Iterable[str]:
        self.on_event(event)
        return ()

    def close(self) -> None:
        for t in list(self._busy.values()):
            t.join(timeout=self.wait)

    def _automatic(self) -> bool | None:
        """NodeRecovery is Automatic? None while the cluster is not the watcher's to act on."""
        row = self.env.store.cluster(self.name)
        if row is None or row.status in HANDS_OFF_CLUSTER:
            return None
        return self.cluster.reload().NodeRecovery == "Automatic"

    def poll(self) -> bool:
        """One look at Docker and Slurm; act where the table says. False once the cluster is gone."""
        if self.env.store.cluster(self.name) is None:
            return False
        automatic = self._automatic()
        if automatic is None:
            return True
        at = time.time()
        containers = self.cluster.node_containers()
        ctl = containers.get(self.cluster.controller_node)
        snodes: dict[str, SlurmNode] = {}
        answered = False
        if ctl is not None and ctl.running:
            try:
                snodes = {n.name: n for n in self.cluster.slurm.nodes()}
                answered = True
            except TRANSIENT as e:  # the controller may be restarting
                log.info("Slurm of %s did not answer: %s", self.name, e)
        with self._lock:
            self._snodes = snodes
            watch_retries = answered and at < self._retries_until
        if down := sorted(n for n, sn in snodes.items() if sn.base == DOWN):
            # Slurm took them out of their jobs: a --no-kill job whose batch host one
            # was runs on with nothing in it unless it runs again (hp's own reboots and
            # replaces do this before they delete a node, rerun_orphans)
            why = {n: f"is down in Slurm ({snodes[n].reason or 'no reason'})" for n in down}
            actions.rerun_orphans(self.cluster, why)
            watch_retries = True  # a job that lost one may be retried or requeued
        if watch_retries:
            self._record_retries()
        recorded = self.env.store.latest_phases(self.name)
        for node in sorted(set(containers) | set(snodes)):
            c = containers.get(node)
            role = c.role if c else "worker"  # Slurm knows only workers
            cond = container_condition(c.state if c else None)
            sn = snodes.get(node)
            why = describe_fact(cond, sn, c.exit_code if c else None, node in self._oom)
            scond = self._lost(node, slurm_condition(sn), at, answered and role == "worker")
            if scond == "lost":
                why = f"Slurm has no record of it for {LOST_AFTER_S:g} s"
            self.consider(Seen(node, role, cond, scond, at, why), automatic, recorded.get(node))
        return True

    def _record_retries(self) -> None:
        """Each `srun --auto-resume` retry Slurm shows (the job that grew its job back) once
        as a Job event; the jobs hp requeued (their batch host was lost) start without
        Slurm's hold."""
        try:
            retries = self.cluster.slurm.auto_resume_retries()
            released = self.cluster.slurm.release_requeued({j for r in retries if (j := r.resumed_job)})
        except TRANSIENT as e:
            log.info("auto-resume retries of %s: %s", self.name, e)
            return
        for j in released:
            log.info("job %s, requeued by hp, starts without Slurm's hold", j)
        for r in retries:
            if r.job_id not in self._retries_seen:
                self._retries_seen.add(r.job_id)
                self.env.store.event(self.name, "Job", "Info", r.describe())

    def _lost(self, node: str, cond: str, at: float, counts: bool) -> str:
        """A worker's 'absent' becomes 'lost' once it lasted LOST_AFTER_S (`counts`: a
        worker, and Slurm answered)."""
        if cond != "absent" or not counts:
            self._absent_since.pop(node, None)
            return cond
        since = self._absent_since.setdefault(node, at)
        return "lost" if at - since >= LOST_AFTER_S else cond

    def on_event(self, ev: Event) -> None:
        """A Docker container event: 'die' means the node's main process ended, 'pause'
        that the container froze."""
        node, role = ev.node, ev.role
        if not node or role not in ("controller", "login", "worker"):
            return
        if ev.action == "oom":
            with self._lock:
                self._oom.add(node)  # the 'die' that follows says why
            return
        if ev.action not in ("die", "pause"):
            return
        # 'pause': frozen. Acted on here, not only at the next poll: a poll may itself be
        # stuck in an exec that froze with the controller (Docker 20.10), and only the
        # reboot's thaw (DockerEngine.unfreeze) frees it.
        cond = "died" if ev.action == "die" else "paused"
        if ev.host and self.cluster.placements().get(node, ev.host) != ev.host:
            return  # a stale copy on a host that came back (the node runs elsewhere): removed, never recovered
        automatic = self._automatic()
        if automatic is None:
            return
        with self._lock:
            sn = self._snodes.get(node)
            oom = node in self._oom
        if role == "worker":  # Slurm's view now, not at the last poll: an admin may have drained it since
            try:
                sn = next((n for n in self.cluster.slurm.nodes() if n.name == node), None)
            except TRANSIENT as e:  # the controller may be down too: use the last poll's
                log.info("Slurm of %s did not answer: %s", self.name, e)
        why = describe_fact(cond, sn, ev.exit_code, oom)
        seen = Seen(node, role, cond, slurm_condition(sn), ev.time or time.time(), why)
        self.consider(seen, automatic, self.env.store.latest_phases(self.name).get(node))

    def consider(self, seen: Seen, automatic: bool, recorded: NodePhase | None) -> None:
        action = decide(seen.role, seen.container, seen.slurm, automatic)
        if action is Action.NONE:
            return
        with self._lock:
            t = self._busy.get(seen.node)
            busy = t is not None and t.is_alive()
            why_not = guard(
                seen,
                recorded,
                busy,
                self._last_done.get(seen.node, 0.0),
                self._retry_at.get(seen.node, 0.0),
                time.time(),
            )
            if why_not:
                log.debug("%s: not acting (%s): %s", seen.node, action, why_not)
                return
            t = threading.Thread(
                target=self._run_action, args=(seen, action), daemon=True, name=f"hp-recover-{self.name}-{seen.node}"
            )
            self._busy[seen.node] = t
            t.start()
        log.info("%s: %s (%s)", seen.node, action, seen.why)

    def _run_action(self, seen: Seen, action: Action) -> None:
        if seen.role == "worker":  # a step that held it may run again (srun --auto-resume)
            with self._lock:
                self._retries_until = time.time() + RETRY_WATCH_S
        try:
            ok = self._act_fn(self.cluster, action, seen.node, seen.why, self.wait)
        except TRANSIENT as e:  # report, back off, keep watching
            log.warning("%s of %s failed: %s", action, seen.node, e)
            ok = False
        except Exception as e:  # noqa: BLE001 - a bug: reported; the node is backed off like a failure, never retried in a loop
            report_bug(self.env.store, self.name, f"{action} of {seen.node}", e, log, node=seen.node)
            ok = False
        engine_answers = ok or self._engine_answers()
        with self._lock:
            self._last_done[seen.node] = time.time()
            self._oom.discard(seen.node)
            if ok:
                self._failures.pop(seen.node, None)
                self._retry_at.pop(seen.node, None)
            elif not engine_answers:  # the action never reached a node: try again soon, no backoff
                self._retry_at[seen.node] = time.time() + POLL_S
            else:
                n = self._failures.get(seen.node, 0)
                self._failures[seen.node] = n + 1
                self._retry_at[seen.node] = time.time() + BACKOFF_S[min(n, len(BACKOFF_S) - 1)]

    def _engine_answers(self) -> bool:
        try:
            self.env.provider.ping()
        except (EngineUnavailable, EngineError):
            return False
        return True
