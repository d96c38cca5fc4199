"""The one launch path: nodes are launched and brought to their groups' targets here, by
the agent all the time and by `hp create` in-process (until its targets are met or its
deadline passes).

A launch (`Launch`): the nodes recorded Queued, their containers created in one batch
(capacity is decided for the whole batch: launcher.py), then started in parallel, all
at once or in parts (create starts the nodes with a lifecycle script while slurmctld
boots); a started node is Launching. The group's passive sync then says what became of
it: Running once it joined Slurm, or a failure (`not_joined`: its container exited, or
it did not register in time). A failure, its reason and its event are written in one
place (`GroupReconciler.failed`); the agent retries it after a backoff.

`GroupReconciler` brings one instance group to its target count: observes (containers,
Slurm, the phase history), then acts; each step is idempotent, so an agent killed at any
moment resumes. Passive sync (what became of launching nodes, of nodes being removed)
comes before the active steps (scale down, scale up). Retry counts and backoff derive
from the history.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..core.context import Cluster, parallel
from ..core.launcher import FileMap, Launcher
from ..docker.provider import Provider
from ..docker.views import Container
from ..errors import LaunchError, OperationFailed
from ..naming import L_GROUP, group_prefix, node_id, node_name, split_node
from ..slurm.model import REMOVING_REASON, SlurmNode
from ..spec.model import InstanceGroup
from ..state.phases import Backoff, History, Owner, Phase, Phases, owner, owner_of
from ..state.store import Latest

log = logging.getLogger("hp.agent")

# a started node registers within this, or its launch failed (the controller at create too)
REGISTER_TIMEOUT = float(os.environ.get("HP_REGISTER_TIMEOUT", "60"))
RESYNC = 10.0  # slow periodic resync: a safety net, events do the real work
BACKOFF = Backoff(initial=1.0, maximum=float(os.environ.get("HP_RETRY_MAX", "10")))
LOG_LINES = 3  # of a failed node's log, in its reason

SNodes = dict[str, SlurmNode]


class Recorder:
    """Writes phase changes (through the store's gate) and one event per change."""

    def __init__(self, cluster: Cluster):
        self.c = cluster

    def history(self, node: str) -> History:
        return History(self.c.store.node_history(self.c.name, node))

    def set(
        self,
        group: str,
        node: str,
        phase: Phase,
        message: str = "",
        *,
        level: str = "Info",
        event: str | None = None,
        node_id: str | None = None,
    ) -> None:
        if self.c.store.set_phase(self.c.name, node, phase, message) and event:
            self.c.store.event(self.c.name, "Instance", level, event, group, node_id, node)


def not_joined(
    p: Provider,
    cid: str | None,
    exit_code: int | None,
    what: str,
    waited: float,
    cap: float = math.inf,
    lines: int = LOG_LINES,
) -> LaunchError | None:
    """Why a started node that has not joined yet failed, or None while it may still join:
    its container exited at start (`exit_code` not None; `cid` None: it is gone), or
    `what` (its daemon did not register) past REGISTER_TIMEOUT (or `cap`) seconds since
    it started. Its last log lines say why. The one place these reasons are made: the
    reconciler's launching nodes, and the controller at create."""
    limit = max(min(REGISTER_TIMEOUT, cap), 0.0)
    if cid is None:
        return LaunchError("ContainerExited", "its container is gone before it joined", retryable=True)
    if exit_code is None and waited <= limit:
        return None
    tail = p.logs(cid, tail=lines).strip().replace("\n", " | ")[-100 * lines :]
    if exit_code is not None:
        return LaunchError(
            "ContainerExited", f"container exited with code {exit_code} at start: {tail}", retryable=True
        )
    return LaunchError(
        "RegistrationTimeout", f"{what} within {limit:g} s; last log: {tail or '(no output)'}", retryable=True
    )


@dataclass(frozen=True)
class _Seen:
    """What one pass of a group read: its spec, the phases, its containers."""

    group: InstanceGroup
    latest: Latest  # the group's nodes
    latest_all: Latest  # every node of the cluster
    mine: dict[str, Container]
    placed: dict[str, str]
    now: float


class GroupReconciler:
    """One instance group (login or compute) of a cluster."""

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        launcher: Launcher,
        on_joined: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
        announce: bool = True,
    ):
        self.c = cluster
        self.announce = announce  # an event for each node that joined (hp create's own nodes: none, as before)
        self.group = group
        self.launcher = launcher
        self.rec = Recorder(cluster)
        self.on_joined = on_joined  # a node of a group with on-start checks joined: check it
        self.clock = clock or cluster.store.clock  # the clock the phase history is written with
        self.failures: dict[str, LaunchError] = {}  # node -> why its last launch failed, until it joins

    def step(self, snodes: SNodes) -> float:
        """One pass (the agent's): passive sync, then scale down or up; returns how long
        until the next pass is needed."""
        seen = self._observe()
        if seen is None:
            return RESYNC
        g, latest, now = seen.group, seen.latest, seen.now
        # 1. passive sync: what became of launching nodes, and nodes being removed
        nxt, active = self._passive(seen, snodes)
        # 2. scale down: extra nodes, idle and broken ones first
        extra = len(active) - g.InstanceCount
        if extra > 0:
            # only nodes the reconciler owns or that run: one under a health check or a
            # recovery is left to finish (the next pass picks again)
            owned = {
                n: ci for n, ci in active.items() if owner_of(latest.get(n), now) in (Owner.RECONCILER, Owner.NONE)
            }
            victims = self._pick_victims(owned, snodes, min(extra, len(owned)))
            if not victims:
                return min(nxt, 2.0)
            for n in victims:
                self.rec.set(
                    self.group,
                    n,
                    Phase.SHUTTING_DOWN,
                    "scale-down",
                    event=f"Instance {n} in cluster {self.c.name} and instance group {self.group} is being "
                    f"removed (scale-down to {g.InstanceCount})",
                )
            return 0.1
        # 3. scale up: launch missing nodes whose retry is due. A node being rebooted or
        # replaced (or checked) may have no container for a moment: its owner acts, it is
        # not missing.
        mine = seen.mine
        recovering = {
            n for n, rec in latest.items() if n not in mine and owner_of(rec, now) in (Owner.RECOVERY, Owner.HEALTH)
        }
        # on a registered host that does not answer: not missing (the host watcher
        # replaces them, or they come back with their host)
        prefix = self.group.lower()
        lost = self.c.lost_nodes(mine, seen.latest_all, seen.placed)
        recovering |= {n for n in lost if group_prefix(n) == prefix}
        missing = g.InstanceCount - len(active) - len(recovering)
        used = {ci.index for ci in mine.values()} | {split_node(n)[1] for n in recovering}
        free = [i for i in range(1, g.InstanceCount + len(mine) + len(recovering) + 2) if i not in used]
        wanted = free[: max(missing, 0)]
        self._close_stale(latest, set(mine), {node_name(self.group, i) for i in wanted}, now)
        due = []
        for i in wanted:
            h = self.rec.history(node_name(self.group, i))
            nr = h.next_retry(BACKOFF)
            if nr is None or now >= nr:
                due.append(i)
            else:
                nxt = min(nxt, nr - now)
        if due:
            self._launch(g, due)
            nxt = min(nxt, 0.3)
        return max(nxt, 0.05)

    def sync(self, snodes: SNodes) -> float:
        """The passive part of a pass alone: what became of the launched nodes (and of nodes
        being removed). `hp create` drives its groups with it while it waits: it launches
        nothing, so retries are left to the agent, and a launching node whose container is
        gone has failed (a pass of the agent would launch it again)."""
        seen = self._observe()
        if seen is None:
            return RESYNC
        nxt, _ = self._passive(seen, snodes)
        for n, rec in seen.latest.items():
            gone = rec.phase is Phase.LAUNCHING and n not in seen.mine
            if gone and (err := not_joined(self.c.p, None, None, "", 0.0)):
                self.failed(n, err)
        return max(nxt, 0.05)

    def _observe(self) -> _Seen | None:
        # The target and the nodes' phases come from one snapshot: a delete-nodes request
        # writes its marks and the lower target together, and is seen whole.
        placed = self.c.placements()  # before the phases: see Cluster.lost_nodes
        row, latest_all = self.c.store.snapshot(self.c.name)
        if row is None:
            return None
        g = self.c.reload(row.spec).group(self.group)
        if g is None or g.node_type == "Controller":
            return None
        prefix = self.group.lower()
        latest = Phases({n: v for n, v in latest_all.items() if group_prefix(n) == prefix})
        listed = self.c.current(self.c.p.containers(self.c.name, {L_GROUP: self.group}))
        mine = {c.node: c for c in listed if c.is_node and c.node}
        return _Seen(g, latest, latest_all, mine, placed, self.clock())

    def _passive(self, seen: _Seen, snodes: SNodes) -> tuple[float, dict[str, Container]]:
        """Sync each node that has a container; (when the next pass is needed, the nodes
        not being removed)."""
        nxt = RESYNC
        active: dict[str, Container] = {}
        for n, ci in seen.mine.items():
            if seen.latest.phase(n) is Phase.SHUTTING_DOWN:
                nxt = min(nxt, self._remove(n, ci, snodes))
                continue
            active[n] = ci
            nxt = min(nxt, self._sync(seen.group, n, ci, self.rec.history(n), snodes, seen.now))
        return nxt, active

    def _sync(self, g: InstanceGroup, n: str, ci: Container, h: History, snodes: SNodes, now: float) -> float:
        ph = h.phase
        sn = snodes.get(n)
        if (
            ph is Phase.RUNNING
            and g.OnStartDeepHealthChecks
            and self.on_joined is not None
            and sn is not None
            and sn.awaiting_onstart
            and not sn.not_responding
        ):
            self.on_joined(n)  # came back (rebooted or replaced by recovery) drained for its on-start check
            return RESYNC
        if ph in (Phase.REBOOTING, Phase.REPLACING) and owner(ph, h.since, now) is Owner.NONE:
            # a recovery whose process died: take the node back
            if self._registered(g, ci, sn):
                self.rec.set(self.group, n, Phase.RUNNING, "recovery did not finish; the node is back")
            return RESYNC
        if ph not in (None, Phase.QUEUED, Phase.LAUNCHING, Phase.LAUNCH_FAILED):
            return RESYNC  # running, or under recovery / health check: not the reconciler's business
        if ci.state == "created":
            # left by a crash between create and start: its files (the auth key) may not have
            # been copied yet, so it is removed and the node launched afresh
            self.c.p.remove_container(ci.id)
            self.rec.set(self.group, n, Phase.QUEUED, "a container left half-made by a crash was removed")
            return 0.05
        if ci.running:
            if ph is not Phase.LAUNCHING:
                if ph in (None, Phase.LAUNCH_FAILED):
                    self.rec.set(self.group, n, Phase.QUEUED, "container found running")
                self.rec.set(self.group, n, Phase.LAUNCHING, "container running, waiting for slurmd")
                h = self.rec.history(n)
            if self._registered(g, ci, sn):
                self._joined(g, n, ci)
                return RESYNC
        elif not ci.dead:
            return 0.5  # restarting or paused: looked at again soon
        started = h.since if h.phase is Phase.LAUNCHING and h.since else now
        code = ci.exit_code if ci.dead else None
        if err := not_joined(self.c.p, ci.id, code, f"slurmd on {n} did not register", now - started):
            self.failed(n, err, ci.id)
            return 0.5
        return 0.3

    def _registered(self, g: InstanceGroup, ci: Container, sn: SlurmNode | None) -> bool:
        if g.node_type == "Login":
            return self.c.slurm.ping_from(ci.id)
        return sn is not None and not sn.not_responding

    def _joined(self, g: InstanceGroup, n: str, ci: Container) -> None:
        self.failures.pop(n, None)
        nid = node_id(ci.id)
        checks = " (drained until its on-start health checks pass)" if g.OnStartDeepHealthChecks else ""
        self.rec.set(
            self.group,
            n,
            Phase.RUNNING,
            "",
            node_id=nid,
            event=f"Instance {nid} ({n}) in cluster {self.c.name} and instance group {self.group} is running "
            f"and joined Slurm{checks}"
            if self.announce
            else None,
        )
        if g.OnStartDeepHealthChecks and g.node_type == "Compute" and self.on_joined is not None:
            self.on_joined(n)

    def failed(self, n: str, err: LaunchError, cid: str | None = None) -> None:
        """The one place a failed launch is written: its container (`cid`) removed, for a
        fresh one on the next try; LaunchFailed with the reason, the try's number and its
        backoff; an event when the reason is new (a retry failing for the same reason adds
        none)."""
        if cid is not None:
            self.c.p.remove_container(cid)
        self.failures[n] = err.with_traceback(None)  # kept: not the frames it was raised in
        h = self.rec.history(n)
        level = "Warn" if err.code == "InsufficientCapacity" else "Error"
        tries = h.try_number()
        retry = BACKOFF.delay(tries)
        new_reason = not (h.phase is Phase.LAUNCH_FAILED and h.message.startswith(f"{err.code}:"))
        self.rec.set(
            self.group,
            n,
            Phase.LAUNCH_FAILED,
            f"{err} (retry {tries}, next in {retry:g} s)",
            level=level,
            event=f"Instance creation in cluster {self.c.name} and instance group {self.group} failed: {err}"
            if new_reason
            else None,
        )

    def _launch(self, g: InstanceGroup, indices: list[int]) -> None:
        batch = Launch(self.launcher, {self.group: self}, [(g, i) for i in indices])
        batch.create()
        batch.start()

    def _close_stale(self, latest: Latest, existing: set[str], wanted: set[str], now: float) -> None:
        """Nodes with no container: one waiting to be launched that the target no longer
        needs is dropped; one left ShuttingDown (e.g. a crash after its container was
        removed) is closed."""
        for n, rec in latest.items():
            if n in existing:
                continue
            if rec.phase in (Phase.QUEUED, Phase.LAUNCH_FAILED) and n not in wanted:
                self.rec.set(self.group, n, Phase.REMOVED, "no longer needed (scaled down)")
            elif rec.phase is Phase.SHUTTING_DOWN:
                self.rec.set(self.group, n, Phase.REMOVED, "its container is gone")

    def _pick_victims(self, active: dict[str, Container], snodes: SNodes, k: int) -> list[str]:
        def rank(n: str) -> tuple[int, int]:
            sn = snodes.get(n)
            ci = active[n]
            if not ci.running or sn is None or sn.not_responding:
                score = 0  # broken or not yet joined
            elif sn.idle:
                score = 1
            else:
                score = 2  # running jobs: last
            return (score, -ci.index)

        return sorted(active, key=rank)[:k]

    def _remove(self, n: str, ci: Container, snodes: SNodes) -> float:
        """Drain, wait for running jobs to end, delete from Slurm, then remove the container."""
        sn = snodes.get(n)
        slurm = self.c.slurm
        if sn is not None and ci.running and not sn.not_responding:
            if not sn.drained:
                slurm.drain([n], REMOVING_REASON)
                return 0.2
            if sn.busy:
                return 1.0  # jobs still running: never killed
        if sn is not None:
            try:
                slurm.delete([n])
            except OperationFailed as e:
                log.warning("deleting %s from Slurm: %s", n, e)
        self.c.p.remove_container(ci.id)
        self.rec.set(
            self.group,
            n,
            Phase.REMOVED,
            "removed",
            event=f"Instance {n} in cluster {self.c.name} and instance group {self.group} was removed",
        )
        return 0.1


class Launch:
    """One batch of launches over any groups, each node recorded by its group's
    reconciler: `create` records the nodes Queued and makes their containers in one go
    (capacity is decided for the whole batch), each node without GPUs started the moment
    its container is made (not after the batch's last create: N = 16, 0.1-0.3 s sooner
    here); `start` starts the others in parallel, all or some at a time, and waits for
    every start of those nodes (a start waits for the node's lifecycle script, if its
    group has one): Launching, or failed. The agent's reconciler launches one group's
    missing nodes with it; `hp create` every group's, while slurmctld boots."""

    def __init__(
        self, launcher: Launcher, recs: Mapping[str, GroupReconciler], wanted: list[tuple[InstanceGroup, int]]
    ):
        self.launcher = launcher
        self.wanted = wanted
        self.rec_of = {node_name(g.InstanceGroupName, i): recs[g.InstanceGroupName] for g, i in wanted}
        self.made: dict[str, str] = {}  # node -> its container, once created
        self.starting: dict[str, Future[LaunchError | None]] = {}  # starts begun as their containers were made
        self.stopped = False  # a create being rolled back: starts still under way record nothing

    def create(self, files: FileMap | None = None) -> dict[str, str]:
        """Queued, then the containers; node -> container id of those made (the others failed)."""
        for n, r in self.rec_of.items():
            h = r.rec.history(n)
            if h.phase is Phase.LAUNCH_FAILED:
                # why it is launched again stays in its status (a Pending node names its shortage)
                last = h.message.split(" (retry ")[0]
                r.rec.set(r.group, n, Phase.QUEUED, f"being launched again (try {h.try_number()}) after {last}")
            elif h.phase is not Phase.QUEUED:
                r.rec.set(r.group, n, Phase.QUEUED, "waiting for capacity")
        pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="hp-start")

        def made(node: str, cid: str) -> None:
            self.starting[node] = pool.submit(self.launcher.start, cid)

        try:
            for n, res in self.launcher.create_many(self.wanted, files, on_made=made).items():
                if isinstance(res, LaunchError):
                    self.rec_of[n].failed(n, res)
                else:
                    self.made[n] = res
        finally:
            pool.shutdown(wait=False)
        return dict(self.made)

    def start(self, nodes: Iterable[str] | None = None) -> None:
        """Start these made nodes (default: all), in parallel; a start already begun is
        waited for."""
        todo = [(n, self.made[n]) for n in (self.made if nodes is None else nodes)]

        def one(t: tuple[str, str]) -> LaunchError | None:
            begun = self.starting.pop(t[0], None)
            return begun.result() if begun is not None else self.launcher.start(t[1])

        errors = parallel(one, todo)
        if self.stopped:
            return
        for (n, cid), err in zip(todo, errors, strict=True):
            r = self.rec_of[n]
            if err:
                r.failed(n, err, cid)
            else:
                r.rec.set(r.group, n, Phase.LAUNCHING, "container started")
