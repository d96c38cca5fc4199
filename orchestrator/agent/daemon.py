"""The per-cluster background agent: keeps provisioning (and recovery) going after the
CLI exits. Run as `python -m orchestrator.agent NAME` (process control: core/agents.py).

One process per cluster, started by `hp create` and restarted by any hp command that
finds it gone. Beside provisioning it runs the recovery watcher, the cluster services'
watch (a dead database or slurmdbd is brought back) and the loopback endpoints (metrics,
the REST front: orchestrator/services). Per cluster rather than per host: a cluster's agent holds only that
cluster's lock, so a crash or a slow Docker call in one cluster never stalls another,
and deleting a cluster is just stopping its agent. Every background behaviour is a
controller on one runtime (orchestrator/runtime.py: threads, wake-ups by Docker events,
per-key backoff, failure policy); provisioning is this module's own (`Provisioning`). An
idle agent sleeps (woken by Docker events, SIGUSR1 from `hp scale`, or a slow resync).

Crash-safety: the agent keeps nothing in memory that matters. Desired counts are in
SQLite, what exists is read from Docker labels, container names are deterministic
(`hp-<cluster>-<node>`: creating one twice fails), and retry counts and timeouts are
derived from the node phase history. SIGKILL at any moment, start again: it resumes.

Failure policy (the runtime's, orchestrator.errors): an error of the outside world
(TRANSIENT) makes a group try again after a short wait; anything else is a bug, reported
once (log with traceback, and an `hp events` entry), and the group it hit is left alone
until the cluster's spec changes or the agent restarts: never retried in a tight loop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import assembly
from ..cluster.create import has_gpus
from ..cluster.reconciler import RESYNC, GroupReconciler
from ..cluster.upgrade import Upgrading
from ..core.context import Cluster, Env
from ..core.launcher import Launcher
from ..core.procs import alive
from ..errors import TRANSIENT, guarded, report_bug
from ..health.requests.onstart import ClusterBusy, check_new_nodes
from ..hosts.hostwatch import HostWatch
from ..naming import group_prefix
from ..recovery.watcher import RecoveryWatcher
from ..runtime import Controller, Result, Runtime
from ..services.endpoints import Endpoints
from ..services.servicewatch import ServiceWatch
from ..slurm.model import SlurmNode
from ..spec.model import InstanceGroup
from ..state.health_requests import Records
from ..state.operations import ROLLS_BACK, Operation, OperationStatus
from ..state.phases import NodePhase, Phase
from ..state.transitions import ENDING, ClusterStatus
from .gpuwatch import GpuWatch
from .onstart_queue import OnStartQueue

log = logging.getLogger("hp.agent")

PRUNE_EVERY_S = 600.0


class Agent:
    def __init__(self, env: Env, name: str):
        self.env = env
        self.name = name
        self.stop = threading.Event()
        self.runtime = Runtime(env.store, name, lambda: env.provider.events(name), self.stop)

    def kick(self) -> None:
        """Look at the cluster's record now (SIGUSR1 from `hp scale`: its spec changed)."""
        self.runtime.enqueue(Provisioning.kind, CLUSTER)

    def run(self) -> int:
        """The cluster's controllers on one runtime (orchestrator/runtime.py), until the
        cluster is gone or the agent is stopped."""
        env, name, rt = self.env, self.name, self.runtime
        if env.store.cluster(name) is None:  # e.g. `python -m orchestrator.agent` by hand, a typo
            log.error("cluster %r does not exist: no agent for it", name)
            return 2
        cluster = Cluster(env, name)

        def onstart_failed(batch: list[str], e: BaseException) -> None:
            if not isinstance(e, TRANSIENT):
                report_bug(env.store, name, f"on-start checks of {', '.join(batch)}", e, log)
                return
            why = f"On-start deep health checks of {', '.join(batch)} could not run: {e}; "
            env.store.event(name, "Cluster", "Error", why + "the nodes stay drained (hp health-check start to retry)")

        onstart = OnStartQueue(lambda nodes: check_new_nodes(cluster, nodes), ClusterBusy, onstart_failed)
        rt.add(Provisioning(cluster, onstart.add, self.stop))
        rt.add(RecoveryWatcher(env, name))
        if env.provider.places_nodes:  # hosts lost and back (hosts/hostwatch.py)
            rt.add(HostWatch(env, name))
        rt.add(ServiceWatch(env, name))
        if has_gpus(cluster.spec, env.catalogue):  # passive GPU monitoring (agent/gpuwatch.py)
            rt.add(GpuWatch(env, name))
        rt.add(onstart)
        rt.add(Upgrading(env, name))  # hp upgrade: the cluster onto another Slurm release
        # the loopback endpoints (metrics, the REST front): a bug in them is reported; the rest goes on
        endpoints = Endpoints(env, name, Records(env.store).summary)
        guarded(env.store, name, "the metrics and REST endpoints", log, endpoints.start)
        rt.start()
        self.stop.wait()
        rt.shutdown()
        return 0


def slurm_nodes(cluster: Cluster) -> dict[str, SlurmNode] | None:
    """Slurm's nodes; None while the controller does not answer (unknown, never "no nodes")."""
    try:
        return {n.name: n for n in cluster.slurm.nodes()}
    except TRANSIENT as e:  # controller down or restarting: unknown for now
        log.info("Slurm did not answer: %s", e)
        return None


def sync_status(cluster: Cluster) -> None:
    """Passive sync of the cluster's status and its scaling operations: close those that
    converged; in all-or-nothing mode, roll back a scale-up that could not be fully
    provisioned (the group returns to its previous count and the nodes it started are
    removed); a cluster still Creating becomes InService once every group is full."""
    store, name = cluster.store, cluster.name
    ops = store.operations(name)
    row = store.cluster(name)
    if not ops and (row is None or row.status != ClusterStatus.CREATING):
        return
    latest = store.latest_phases(name)

    def phases(g: InstanceGroup) -> list[NodePhase]:
        return [r for n, r in latest.items() if group_prefix(n) == g.InstanceGroupName.lower()]

    for op in ops:
        if not op.kind.changes_count:  # health checks, recovery by hand, upgrades: their own code ends them
            continue
        g = cluster.spec.group(op.group)
        if g is None:
            store.end_operation(op.id, OperationStatus.FAILED, "group no longer exists")
            continue
        ph = phases(g)
        failed = [r.message for r in ph if r.phase is Phase.LAUNCH_FAILED]
        if failed and not cluster.spec.continuous and op.kind in ROLLS_BACK and op.previous is not None:
            _roll_back(cluster, op, g.InstanceGroupName, failed[0])
            continue
        running = sum(1 for r in ph if r.phase is Phase.RUNNING)
        busy = any(r.phase in (Phase.QUEUED, Phase.LAUNCHING, Phase.LAUNCH_FAILED, Phase.SHUTTING_DOWN) for r in ph)
        if running == g.InstanceCount and not busy:
            store.end_operation(op.id, OperationStatus.DONE)
            what = f"{op.kind} of instance group {g.InstanceGroupName} in cluster {name} completed: {running} node(s)"
            store.event(name, "InstanceGroup", "Info", what, g.InstanceGroupName, operation=op.id)
    if row is not None and row.status == ClusterStatus.CREATING:
        groups = [g for g in cluster.spec.InstanceGroups if g.node_type != "Controller"]
        if all(sum(1 for r in phases(g) if r.phase is Phase.RUNNING) >= g.InstanceCount for g in groups):
            # expect: a delete may have begun since the row was read
            store.set_status(name, ClusterStatus.IN_SERVICE, expect=ClusterStatus.CREATING)


def _roll_back(cluster: Cluster, op: Operation, group: str, why: str) -> None:
    store, name = cluster.store, cluster.name
    msg = (
        f"Scaling instance group {group} in cluster {name} to {op.target} failed "
        f"(all-or-nothing), rolling back to {op.previous}: {why}"
    )

    def revert(spec: dict[str, Any]) -> dict[str, Any]:
        for ig in spec["InstanceGroups"]:
            if ig["InstanceGroupName"] == group:
                ig["InstanceCount"] = op.previous
        return spec

    store.update_spec(name, revert)
    store.end_operation(op.id, OperationStatus.FAILED, msg)
    store.event(name, "InstanceGroup", "Error", msg, group, operation=op.id)
    cluster.reload()


CLUSTER = ""  # the provisioning controller's key of the cluster itself; its other keys are groups
SNODES_FRESH_S = 0.25  # groups due together share one look at Slurm


class Provisioning(Controller):
    """Keeps each instance group at its target count (cluster/reconciler.py's GroupReconciler,
    one key per group), and the cluster's record: its spec reloaded when it changed, its
    status and scaling operations synced (sync_status), the agent stopped once the
    cluster or hp's state folder is gone."""

    kind = "provisioning"
    keys = (CLUSTER,)
    backoff = (2.0,)

    def __init__(self, cluster: Cluster, onstart: Callable[[str], None], stop: threading.Event):
        self.cluster, self.onstart, self.stop = cluster, onstart, stop
        self.images: dict[str, str] | None = None  # the node images' tags, read by the first pass
        self.release = cluster.spec.release  # the images' (hp upgrade changes the cluster's)
        self.recs: dict[str, GroupReconciler] = {}
        self.groups: list[str] = []
        self.last_updated: str | None = None
        self.last_prune = 0.0
        self._snodes: tuple[float, dict[str, SlurmNode] | None] = (0.0, None)

    def describe(self, key: str) -> str:
        return f"provisioning of group {key}" if key else "provisioning"

    def watch(self, event: Any) -> Iterable[str]:
        return (CLUSTER,) if event.action in ("die", "start", "destroy", "oom", "create") else ()

    def reconcile(self, key: str) -> Result:
        return self._group(key) if key else self._cluster()

    def _cluster(self) -> Result:
        env, rt, name = self.cluster.env, self.runtime, self.cluster.name
        assert rt is not None
        if env.store.gone():  # nothing it writes would be read: its cluster's containers are left as they are
            log.warning("hp's state folder %s was removed: agent exits", env.store.home)
            self.stop.set()
            return Result()
        row = env.store.cluster(name)
        if row is None or row.status in ENDING:
            log.info("cluster is %s: agent exits", row.status if row else "gone")
            self.stop.set()
            return Result()
        if row.updated != self.last_updated or self.images is None:
            self.cluster.reload()
            if self.images is None or self.cluster.spec.release != self.release:
                # the first pass, or upgraded (nodes launched from now on run the new release); the
                # engine may be restarting as the agent starts (hp starts it as a create ends):
                # its error is the runtime's backoff, groups wait for the tags
                self.images = self.cluster.images.refs(env.node_image_defs())
                self.release = self.cluster.spec.release
                self.recs.clear()
            self.last_updated = row.updated
            groups = [g.InstanceGroupName for g in self.cluster.spec.InstanceGroups if g.node_type != "Controller"]
            for g in set(self.groups) - set(groups):
                rt.forget(self.kind, g)
                self.recs.pop(g, None)
            self.groups = groups
            rt.reset(self.kind)
            for g in groups:
                self.enqueue(g)
        now = time.monotonic()
        if now - self.last_prune > PRUNE_EVERY_S:
            self.last_prune = now
            env.store.prune()
        env.store.end_orphaned_operations(name, alive)  # an hp reboot / replace killed mid-way
        sync_status(self.cluster)
        return Result(RESYNC)

    def _group(self, group: str) -> Result:
        if group not in self.groups:
            return Result()
        at, snodes = self._snodes
        if snodes is None or time.monotonic() - at > SNODES_FRESH_S:
            snodes = slurm_nodes(self.cluster)
            self._snodes = (time.monotonic(), snodes)
        if snodes is None:  # controller down: nothing can join; recovery restarts it
            return Result(1.0)
        if self.images is None:  # not read yet: the cluster's key enqueues every group once it is
            return Result()
        rec = self.recs.setdefault(
            group, GroupReconciler(self.cluster, group, Launcher(self.cluster, self.images), self.onstart)
        )
        wait = rec.step(snodes)
        self.enqueue(CLUSTER)  # the cluster's status and operations, as this step left them
        return Result(wait)


def main(argv: list[str] | None = None) -> int:
    """The agent of cluster ARGV[0], which holds the cluster's lock (agent/__main__.py took
    it before it loaded this module)."""
    args = sys.argv[1:] if argv is None else argv
    name = args[0]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    env = assembly.env()
    agent = Agent(env, name)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: agent.kick())
    log.info("agent for cluster %s started (pid %d)", name, os.getpid())
    try:
        return agent.run()
    finally:
        log.info("agent for cluster %s stopped", name)
