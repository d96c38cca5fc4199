"""Brings one instance group to its target count: observes (containers, Slurm, the phase
history), then acts; each step is idempotent, so an agent killed at any moment resumes.

Passive sync (what became of launching nodes, of nodes being removed) comes before the
active steps (scale down, scale up). Retry counts and backoff derive from the history.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ..docker.views import Container
from ..errors import LaunchError, OperationFailed
from ..naming import group_prefix, node_id, node_name, split_node
from ..slurm.model import REMOVING_REASON, SlurmNode
from ..spec.model import InstanceGroup
from ..state.phases import Backoff, History, Owner, Phase, owner
from ..state.store import Latest
from .context import Cluster, parallel
from .launcher import Launcher

log = logging.getLogger("hp.agent")

REGISTER_TIMEOUT = float(os.environ.get("HP_REGISTER_TIMEOUT", "60"))
RESYNC = 10.0  # slow periodic resync: a safety net, events do the real work
BACKOFF = Backoff(initial=1.0, maximum=float(os.environ.get("HP_RETRY_MAX", "10")))

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


class GroupReconciler:
    """One instance group (login or compute) of a cluster."""

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        launcher: Launcher,
        on_joined: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.c = cluster
        self.group = group
        self.launcher = launcher
        self.rec = Recorder(cluster)
        self.on_joined = on_joined  # a node of a group with on-start checks joined: check it
        self.clock = clock or cluster.store.clock  # the clock the phase history is written with

    def step(self, snodes: SNodes) -> float:
        """One pass; returns how long until the next pass is needed."""
        # The target and the nodes' phases come from one snapshot: a delete-nodes request
        # writes its marks and the lower target together, and is seen whole.
        placed = self.c.placements()  # before the phases: see Cluster.lost_nodes
        row, latest_all = self.c.store.snapshot(self.c.name)
        if row is None:
            return RESYNC
        g = self.c.reload(row.spec).group(self.group)
        if g is None or g.node_type == "Controller":
            return RESYNC
        prefix = self.group.lower()
        latest = {n: v for n, v in latest_all.items() if group_prefix(n) == prefix}
        now = self.clock()
        listed = self.c.current(self.c.p.containers(self.c.name, {"io.hp.group": self.group}))
        mine = {c.node: c for c in listed if c.is_node and c.node}
        phase = {n: v[0] for n, v in latest.items()}
        nxt = RESYNC
        # 1. passive sync: what became of launching nodes, and nodes being removed
        active: dict[str, Container] = {}
        for n, ci in mine.items():
            if phase.get(n) == Phase.SHUTTING_DOWN.value:
                nxt = min(nxt, self._remove(n, ci, snodes))
                continue
            active[n] = ci
            nxt = min(nxt, self._sync(g, n, ci, self.rec.history(n), snodes, now))
        # 2. scale down: extra nodes, idle and broken ones first
        extra = len(active) - g.InstanceCount
        if extra > 0:
            # only nodes the reconciler owns or that run: one under a health check or a
            # recovery is left to finish (the next pass picks again)
            owned = {
                n: ci
                for n, ci in active.items()
                if owner(phase.get(n), latest.get(n, ("", "", now))[2], now) in (Owner.RECONCILER, Owner.NONE)
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
        recovering = {
            n
            for n, (_, _, t) in latest.items()
            if n not in mine and owner(phase[n], t, now) in (Owner.RECOVERY, Owner.HEALTH)
        }
        # on a registered host that does not answer: not missing (the host watcher
        # replaces them, or they come back with their host)
        recovering |= {n for n in self.c.lost_nodes(mine, latest_all, placed) if group_prefix(n) == prefix}
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
        if ci.dead:
            tail = self.c.p.logs(ci.id, tail=3).strip().replace("\n", " | ")[-300:]
            err = LaunchError(
                "ContainerExited", f"container exited with code {ci.exit_code} at start: {tail}", retryable=True
            )
            self._failed(n, err, ci)
            return 0.5
        if not ci.running:
            return 0.5
        if ph is not Phase.LAUNCHING:
            if ph in (None, Phase.LAUNCH_FAILED):
                self.rec.set(self.group, n, Phase.QUEUED, "container found running")
            self.rec.set(self.group, n, Phase.LAUNCHING, "container running, waiting for slurmd")
            h = self.rec.history(n)
        if self._registered(g, ci, sn):
            self._joined(g, n, ci)
            return RESYNC
        started = h.since if h.phase is Phase.LAUNCHING and h.since else now
        if now - started > REGISTER_TIMEOUT:
            err = LaunchError(
                "RegistrationTimeout", f"slurmd on {n} did not register within {REGISTER_TIMEOUT:g} s", retryable=True
            )
            self._failed(n, err, ci)
            return 0.5
        return 0.3

    def _registered(self, g: InstanceGroup, ci: Container, sn: SlurmNode | None) -> bool:
        if g.node_type == "Login":
            return self.c.slurm.ping_from(ci.id)
        return sn is not None and not sn.not_responding

    def _joined(self, g: InstanceGroup, n: str, ci: Container) -> None:
        nid = node_id(ci.id)
        checks = " (drained until its on-start health checks pass)" if g.OnStartDeepHealthChecks else ""
        self.rec.set(
            self.group,
            n,
            Phase.RUNNING,
            "",
            node_id=nid,
            event=f"Instance {nid} ({n}) in cluster {self.c.name} and instance group {self.group} is running "
            f"and joined Slurm{checks}",
        )
        if g.OnStartDeepHealthChecks and g.node_type == "Compute" and self.on_joined is not None:
            self.on_joined(n)

    def _failed(self, n: str, err: LaunchError, ci: Container | None) -> None:
        if ci is not None:
            self.c.p.remove_container(ci.id)  # a fresh container on the next try
        h = self.rec.history(n)
        level = "Warn" if err.code == "InsufficientCapacity" else "Error"
        tries = h.failures_since_running() + 1
        retry = BACKOFF.delay(tries)
        new_reason = not (h.phase is Phase.LAUNCH_FAILED and h.message.startswith(f"{err.code}:"))
        self.rec.set(
            self.group,
            n,
            Phase.LAUNCH_FAILED,
            f"{err} (retry {tries}, next in {retry:g} s)",
            level=level,
            # one event per change: a retry failing for the same reason adds none
            event=f"Instance creation in cluster {self.c.name} and instance group {self.group} failed: {err}"
            if new_reason
            else None,
        )

    def _launch(self, g: InstanceGroup, indices: list[int]) -> None:
        for i in indices:
            n = node_name(self.group, i)
            if self.rec.history(n).phase is not Phase.QUEUED:
                self.rec.set(self.group, n, Phase.QUEUED, "waiting for capacity")
        res = self.launcher.create_many([(g, i) for i in indices])
        made = [(n, r) for n, r in res.items() if isinstance(r, str)]
        # in parallel: a start waits for the node's lifecycle script, if its group has one
        started = dict(zip([n for n, _ in made], parallel(lambda t: self.launcher.start(t[1]), made), strict=True))
        for n, r in res.items():
            if isinstance(r, LaunchError):
                self._failed(n, r, None)
                continue
            if err := started[n]:
                self.c.p.remove_container(r)
                self._failed(n, err, None)
                continue
            self.rec.set(self.group, n, Phase.LAUNCHING, "container started")

    def _close_stale(self, latest: Latest, existing: set[str], wanted: set[str], now: float) -> None:
        """Nodes with no container: one waiting to be launched that the target no longer
        needs is dropped; one left ShuttingDown (e.g. a crash after its container was
        removed) is closed."""
        for n, (ph, _, _) in latest.items():
            if n in existing:
                continue
            if ph in (Phase.QUEUED.value, Phase.LAUNCH_FAILED.value) and n not in wanted:
                self.rec.set(self.group, n, Phase.REMOVED, "no longer needed (scaled down)")
            elif ph == Phase.SHUTTING_DOWN.value:
                self.rec.set(self.group, n, Phase.REMOVED, "its container is gone")

    def _pick_victims(self, active: dict[str, Container], snodes: SNodes, k: int) -> list[str]:
        def rank(n: str) -> tuple[int, int]:
            sn = snodes.get(n)
            ci = active[n]
            if not ci.running or sn is None or sn.not_responding:
                score = 0  # broken or not yet joined
            elif sn.base == "IDLE":
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
