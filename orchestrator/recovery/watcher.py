"""Automatic node recovery: watch a cluster's containers (Docker events, at once) and its
Slurm node states (a poll every 2 s), and reboot or replace nodes that died.

The decision is rules.py's table; the watcher only observes and guards against acting
on nodes someone else owns. A controller of the agent's runtime (orchestrator/runtime.py):
its key "" is the poll, the cluster's Docker events reach `watch`; both keep each node's
latest observation and offer its key "node:<name>", which takes the action on one of the
runtime's workers: never twice at once, a failed one backed off by the runtime's table
(rules.BACKOFF_S).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ..core.context import Cluster, Env
from ..docker.views import Event
from ..errors import TRANSIENT, EngineError, EngineUnavailable
from ..runtime import Controller, Result, node_key, node_of
from ..slurm.model import DOWN, SlurmNode
from ..state.phases import NodePhase
from ..state.transitions import NODES_HANDS_OFF
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
# Slurm's full node records (scontrol's JSON) are read when a cheap look (node_digest) differs
# from the last one, and at least this often
FULL_EVERY_S = 10.0
# After hp takes a worker, how long the watcher looks for `srun --auto-resume` retries
# (each one an event): the plugin's --auto-resume-timeout default, and a margin.
RETRY_WATCH_S = 660.0

Act = Callable[[Cluster, Action, str, str, float], bool]


class Look(NamedTuple):
    """A node's latest observation, what its key acts on."""

    seen: Seen
    automatic: bool
    recorded: NodePhase | None


class RecoveryWatcher(Controller):
    """Watches one cluster and recovers its nodes, each on a key of its own."""

    kind = "recovery"
    backoff = BACKOFF_S  # a node whose recovery failed, before it is tried again
    workers = 8  # the poll, and up to 7 nodes recovered at once

    def __init__(self, env: Env, name: str, wait: float = 60.0, act: Act | None = None):
        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.wait = wait
        self._act_fn = act or actions.step
        self._lock = threading.Lock()
        self._looks: dict[str, Look] = {}  # nodes whose facts call for an action: the latest look at each
        self._snodes: dict[str, SlurmNode] = {}
        self._oom: set[str] = set()
        self._absent_since: dict[str, float] = {}  # running workers Slurm has no record of
        self._retries_until = 0.0  # look for auto-resume retries until then (RETRY_WATCH_S)
        self._retries_seen: set[int] = set()
        self._full: tuple[str, float, dict[str, SlurmNode]] | None = None  # digest, when, nodes

    # -- the controller ---------------------------------------------------------------
    def reconcile(self, key: str) -> Result:
        """A node's key: its action. Key "": one poll, and the next in POLL_S; none once
        the cluster is gone."""
        if (node := node_of(key)) is not None:
            return self.recover(node)
        try:
            return Result(POLL_S) if self.poll() else Result()
        except TRANSIENT as e:  # an engine hiccup must not end the watch: the next poll
            log.info("recovery poll of %s: %s", self.name, e)
            return Result(POLL_S)

    def describe(self, key: str) -> str:
        node = node_of(key)
        look = self._looks.get(node or "")
        if look is None:
            return super().describe(key)
        return f"{decide(look.seen.role, look.seen.container, look.seen.slurm, look.automatic)} of {node}"

    def _automatic(self) -> bool | None:
        """NodeRecovery is Automatic? None while the cluster is not the watcher's to act on."""
        row = self.env.store.cluster(self.name)
        if row is None or row.status in NODES_HANDS_OFF:
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
                snodes = self._slurm_nodes()
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

    def _slurm_nodes(self) -> dict[str, SlurmNode]:
        """Slurm's nodes: the last full read while the digest stays the same (FULL_EVERY_S
        at most). The digest is taken first: a change after it shows in the next one."""
        slurm = self.cluster.slurm
        digest, now = slurm.node_digest(), time.monotonic()
        if self._full is None or self._full[0] != digest or now - self._full[1] >= FULL_EVERY_S:
            self._full = (digest, now, {n.name: n for n in slurm.nodes()})
        return self._full[2]

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

    def watch(self, ev: Event) -> Iterable[str]:
        """A Docker container event: 'die' means the node's main process ended, 'pause'
        that the container froze (the look is kept and the node's key offered: `consider`)."""
        node, role = ev.node, ev.role
        if not node or role not in ("controller", "login", "worker"):
            return ()
        if ev.action == "oom":
            with self._lock:
                self._oom.add(node)  # the 'die' that follows says why
            return ()
        if ev.action not in ("die", "pause"):
            return ()
        # 'pause': frozen. Acted on here, not only at the next poll: a poll may itself be
        # stuck in an exec that froze with the controller (Docker 20.10), and only the
        # reboot's thaw (DockerEngine.unfreeze) frees it.
        cond = "died" if ev.action == "die" else "paused"
        if ev.host and self.cluster.placements().get(node, ev.host) != ev.host:
            return ()  # a stale copy on a host that came back (the node runs elsewhere): removed, never recovered
        automatic = self._automatic()
        if automatic is None:
            return ()
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
        return ()

    def consider(self, seen: Seen, automatic: bool, recorded: NodePhase | None) -> None:
        """Keep the look at a node whose facts call for an action, and offer its key (the
        runtime takes it unless it runs, backs off or is parked: then it reads this look)."""
        if decide(seen.role, seen.container, seen.slurm, automatic) is Action.NONE:
            with self._lock:
                self._looks.pop(seen.node, None)
            return
        with self._lock:
            self._looks[seen.node] = Look(seen, automatic, recorded)
        if self._why_not(seen.node) is None:
            self.offer(node_key(seen.node))

    def _why_not(self, node: str) -> str | None:
        """Why not to act on the node's latest look now (rules.guard)."""
        look = self._looks.get(node)
        if look is None:
            return "nothing calls for it"
        ended = self.runtime.ended(self.kind, node_key(node)) if self.runtime else 0.0
        return guard(look.seen, look.recorded, ended, time.time())

    def recover(self, node: str) -> Result:
        """A node's key: the action its latest look calls for; a failure is backed off by
        the runtime (Result.failed), one that never reached a node is tried at the next poll."""
        with self._lock:
            look = self._looks.get(node)
        if look is None or (why_not := self._why_not(node)) is not None:
            log.debug("%s: not acting: %s", node, why_not if look else "nothing calls for it")
            return Result()
        seen, action = look.seen, decide(look.seen.role, look.seen.container, look.seen.slurm, look.automatic)
        log.info("%s: %s (%s)", node, action, seen.why)
        if seen.role == "worker":  # a step that held it may run again (srun --auto-resume)
            with self._lock:
                self._retries_until = time.time() + RETRY_WATCH_S
        try:
            ok = self._act_fn(self.cluster, action, node, seen.why, self.wait)
        except TRANSIENT as e:  # backed off, the watch goes on
            log.warning("%s of %s failed: %s", action, node, e)
            ok = False
        with self._lock:
            self._oom.discard(node)
        if ok:
            return Result()
        if not self._engine_answers():  # the action never reached a node: again soon, no backoff
            return Result(POLL_S)
        return Result.backoff()

    def _engine_answers(self) -> bool:
        try:
            self.env.provider.ping()
        except (EngineUnavailable, EngineError):
            return False
        return True
