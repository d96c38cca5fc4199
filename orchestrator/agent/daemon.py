"""The per-cluster background agent: keeps provisioning (and recovery) going after the
CLI exits. Run as `python -m orchestrator.agent NAME` (process control: core/agents.py).

One process per cluster, started by `hp create` and restarted by any hp command that
finds it gone. Beside provisioning it runs the recovery watcher, the cluster services'
watch (a dead database or slurmdbd is brought back) and the loopback endpoints (metrics,
the REST front: orchestrator/services). Per cluster rather than per host: a cluster's agent holds only that
cluster's lock, so a crash or a slow Docker call in one cluster never stalls another,
and deleting a cluster is just stopping its agent. An idle agent sleeps on a condition
(woken by Docker events, SIGUSR1 from `hp scale`, or a slow resync).

Crash-safety: the agent keeps nothing in memory that matters. Desired counts are in
SQLite, what exists is read from Docker labels, container names are deterministic
(`hp-<cluster>-<node>`: creating one twice fails), and retry counts and timeouts are
derived from the node phase history. SIGKILL at any moment, start again: it resumes.

Failure policy (orchestrator.errors): an error of the outside world (TRANSIENT) makes a
group try again after a short wait; anything else is a bug, reported once (log with
traceback, and an `hp events` entry), and the group it hit is left alone until the
cluster's spec changes or the agent restarts: never retried in a tight loop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from .. import assembly
from ..cluster.create import has_gpus
from ..cluster.reconciler import RESYNC, GroupReconciler
from ..core.agents import DEAD_STATUSES
from ..core.context import Cluster, Env
from ..core.launcher import Launcher
from ..errors import TRANSIENT, EngineError, EngineUnavailable, bug_signature, guarded, report_bug
from ..health.requests.onstart import ClusterBusy, check_new_nodes
from ..hosts.hostwatch import HostWatch
from ..naming import SERVICE_HOSTS, group_prefix
from ..recovery.watcher import RecoveryWatcher
from ..services.endpoints import Endpoints
from ..services.servicewatch import ServiceWatch
from ..slurm.model import SlurmNode
from ..spec.model import InstanceGroup
from ..state.health_requests import Records
from ..state.phases import Phase
from ..state.transitions import ClusterStatus
from .gpuwatch import GpuWatch
from .onstart_queue import OnStartQueue

log = logging.getLogger("hp.agent")

PRUNE_EVERY_S = 600.0


class Agent:
    def __init__(self, env: Env, name: str):
        self.env = env
        self.name = name
        self.stop = threading.Event()
        self.wake = threading.Condition(threading.RLock())  # re-entrant: kicked from signal handlers
        self._woken = False
        self._bugs: dict[str, str] = {}  # group -> signature of the bug that stopped it (until the spec changes)
        self._services: Any = None  # services/watch.ServiceWatch, once started

    def kick(self) -> None:
        with self.wake:
            self._woken = True
            self.wake.notify_all()

    def _sleep(self, seconds: float) -> None:
        with self.wake:
            if not self._woken and not self.stop.is_set():
                self.wake.wait(seconds)
            self._woken = False

    def _events(self) -> None:
        """Docker events of this cluster's containers wake the reconciler at once."""
        while not self.stop.is_set():
            try:
                for ev in self.env.provider.events(self.name):
                    if ev.action in ("die", "start", "destroy", "oom", "create"):
                        self.kick()
                    if ev.role in SERVICE_HOSTS and ev.action in ("die", "destroy", "pause") and self._services:
                        self._services.kick()  # a cluster service stopped: the watch brings it back
                    if self.stop.is_set():
                        return
            except (EngineError, EngineUnavailable) as e:  # engine restarted: reconnect
                log.warning("event stream: %s", e)
                self.stop.wait(1)

    def _recovery(self) -> None:
        # a bug in the watcher is reported; provisioning goes on without it
        guarded(
            self.env.store, self.name, "the recovery watcher", log, RecoveryWatcher(self.env, self.name).run, self.stop
        )

    def _hosts(self) -> None:
        # a bug in the host watcher is reported; provisioning and recovery go on without it
        guarded(self.env.store, self.name, "the host watcher", log, HostWatch(self.env, self.name).run, self.stop)

    def _cluster_services(self) -> None:
        """Accounting and REST (services/): the watch that keeps them up, and the
        loopback endpoints (metrics, the REST front)."""
        guarded(
            self.env.store,
            self.name,
            "the metrics and REST endpoints",
            log,
            Endpoints(self.env, self.name, Records(self.env.store).summary).start,
        )
        self._services = ServiceWatch(self.env, self.name)
        guarded(self.env.store, self.name, "the services watch", log, self._services.run, self.stop)

    def _gpu_watch(self) -> None:
        guarded(self.env.store, self.name, "the GPU monitors", log, GpuWatch(self.env, self.name).run, self.stop)

    def _onstart_queue(self) -> OnStartQueue:
        cluster = Cluster(self.env, self.name)

        def on_error(batch: list[str], e: BaseException) -> None:
            if isinstance(e, TRANSIENT):
                self.env.store.event(
                    self.name,
                    "Cluster",
                    "Error",
                    f"On-start deep health checks of {', '.join(batch)} could not run: {e}; "
                    "the nodes stay drained (hp health-check start to retry)",
                )
            else:
                report_bug(self.env.store, self.name, f"on-start checks of {', '.join(batch)}", e, log)

        return OnStartQueue(lambda nodes: check_new_nodes(cluster, nodes), ClusterBusy, on_error, self.stop).start()

    def _image_refs(self) -> dict[str, str] | None:
        """The node images' tags, once the engine answers: it may be restarting as the
        agent starts (hp starts it as a create ends). None when stopped first."""
        while not self.stop.is_set():
            try:
                return Cluster(self.env, self.name).images.refs(self.env.node_image_defs())
            except TRANSIENT as e:
                log.warning("the node images cannot be read yet: %s", e)
                self._sleep(1)
        return None

    def run(self) -> int:
        env = self.env
        if env.store.cluster(self.name) is None:  # e.g. `python -m orchestrator.agent` by hand, a typo
            log.error("cluster %r does not exist: no agent for it", self.name)
            return 2
        images = self._image_refs()
        if images is None:
            return 0
        cluster = Cluster(env, self.name)
        threading.Thread(target=self._events, daemon=True, name="events").start()
        threading.Thread(target=self._recovery, daemon=True, name="recovery").start()
        if env.multihost:  # hosts lost and back (hosts/hostwatch.py)
            threading.Thread(target=self._hosts, daemon=True, name="hosts").start()
        threading.Thread(target=self._cluster_services, daemon=True, name="services").start()

        if has_gpus(cluster.spec, env.catalogue):  # passive GPU monitoring (agent/gpuwatch.py)
            threading.Thread(target=self._gpu_watch, daemon=True, name="gpu-monitors").start()
        onstart = self._onstart_queue()
        recs: dict[str, GroupReconciler] = {}
        due: dict[str, float] = {}
        last_updated = None
        last_prune = 0.0
        while not self.stop.is_set():
            if env.store.gone():  # nothing it writes would be read: its cluster's containers are left as they are
                log.warning("hp's state folder %s was removed: agent exits", env.store.home)
                return 0
            row = env.store.cluster(self.name)
            if row is None or row.status in DEAD_STATUSES:
                log.info("cluster is %s: agent exits", row.status if row else "gone")
                return 0
            if row.updated != last_updated:
                last_updated = row.updated
                cluster.reload()
                due, self._bugs = {}, {}
            now = time.monotonic()
            if now - last_prune > PRUNE_EVERY_S:
                last_prune = now
                env.store.prune()
            groups = [g.InstanceGroupName for g in cluster.spec.InstanceGroups if g.node_type != "Controller"]
            ready = [g for g in groups if due.get(g, 0) <= now and g not in self._bugs]
            snodes = self._slurm_nodes(cluster) if ready else {}
            if ready and snodes is None:  # controller down: nothing can join; recovery restarts it
                self._sleep(1)
                continue
            for gname in ready:
                rec = recs.setdefault(gname, GroupReconciler(cluster, gname, Launcher(cluster, images), onstart.add))
                due[gname] = now + self._step(rec, snodes or {})
            self._sync_status(cluster)
            wait = min([d - time.monotonic() for g, d in due.items() if g not in self._bugs] + [RESYNC])
            self._sleep(max(wait, 0.05))
        return 0

    def _step(self, rec: GroupReconciler, snodes: dict[str, SlurmNode]) -> float:
        try:
            return rec.step(snodes)
        except TRANSIENT as e:
            log.warning("group %s: %s", rec.group, e)
            return 2.0
        except Exception as e:  # noqa: BLE001 - a bug: reported once; the group waits for a spec change or a restart
            sig = bug_signature(e)
            if self._bugs.get(rec.group) != sig:
                report_bug(self.env.store, self.name, f"provisioning of group {rec.group}", e, log, group=rec.group)
            self._bugs[rec.group] = sig
            return RESYNC

    def _slurm_nodes(self, cluster: Cluster) -> dict[str, SlurmNode] | None:
        try:
            return {n.name: n for n in cluster.slurm.nodes()}
        except TRANSIENT as e:  # controller down or restarting: unknown for now
            log.info("Slurm did not answer: %s", e)
            return None

    def _sync_status(self, cluster: Cluster) -> None:
        """Passive sync of the cluster's status and its scaling operations: close those that
        converged; in all-or-nothing mode, roll back a scale-up that could not be fully
        provisioned (the group returns to its previous count and the nodes it started are
        removed); a cluster still Creating becomes InService once every group is full."""
        store = self.env.store
        ops = store.operations(self.name)
        row = store.cluster(self.name)
        if not ops and (row is None or row.status != ClusterStatus.CREATING):
            return
        latest = store.latest_phases(self.name)

        def phases(g: InstanceGroup) -> list[tuple[str, str]]:
            return [(p, m) for n, (p, m, _) in latest.items() if group_prefix(n) == g.InstanceGroupName.lower()]

        for op in ops:
            g = cluster.spec.group(op["group"])
            if g is None:
                store.end_operation(op["id"], "Failed", "group no longer exists")
                continue
            ph = phases(g)
            failed = [m for p, m in ph if p == Phase.LAUNCH_FAILED.value]
            if failed and not cluster.spec.continuous and op["kind"] == "Scale" and op["previous"] is not None:
                self._roll_back(cluster, op, g, failed[0])
                continue
            running = sum(1 for p, _ in ph if p == Phase.RUNNING.value)
            busy = any(p in (Phase.QUEUED, Phase.LAUNCHING, Phase.LAUNCH_FAILED, Phase.SHUTTING_DOWN) for p, _ in ph)
            if running == g.InstanceCount and not busy:
                store.end_operation(op["id"], "Succeeded")
                store.event(
                    self.name,
                    "InstanceGroup",
                    "Info",
                    f"{op['kind']} of instance group {g.InstanceGroupName} in cluster {self.name} completed: "
                    f"{running} node(s)",
                    g.InstanceGroupName,
                )
        if row is not None and row.status == ClusterStatus.CREATING:
            done = all(
                sum(1 for p, _ in phases(g) if p == Phase.RUNNING.value) >= g.InstanceCount
                for g in cluster.spec.InstanceGroups
                if g.node_type != "Controller"
            )
            if done:
                # expect: a delete may have begun since the row was read
                store.set_status(self.name, ClusterStatus.IN_SERVICE, expect=ClusterStatus.CREATING)

    def _roll_back(self, cluster: Cluster, op: dict[str, Any], g: InstanceGroup, why: str) -> None:
        store = self.env.store
        msg = (
            f"Scaling instance group {g.InstanceGroupName} in cluster {self.name} to {op['target']} failed "
            f"(all-or-nothing), rolling back to {op['previous']}: {why}"
        )

        def revert(
            spec: dict[str, Any], prev: int = op["previous"], gname: str = g.InstanceGroupName
        ) -> dict[str, Any]:
            for ig in spec["InstanceGroups"]:
                if ig["InstanceGroupName"] == gname:
                    ig["InstanceCount"] = prev
            return spec

        store.update_spec(self.name, revert)
        store.end_operation(op["id"], "Failed", msg)
        store.event(self.name, "InstanceGroup", "Error", msg, g.InstanceGroupName)
        cluster.reload()


def main(argv: list[str] | None = None) -> int:
    """The agent of cluster ARGV[0], which holds the cluster's lock (agent/__main__.py took
    it before it loaded this module)."""
    args = sys.argv[1:] if argv is None else argv
    name = args[0]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    env = assembly.env()
    agent = Agent(env, name)
    signal.signal(
        signal.SIGTERM, lambda *_: (agent.stop.set(), agent.kick(), agent._services and agent._services.kick())
    )
    signal.signal(signal.SIGUSR1, lambda *_: agent.kick())
    log.info("agent for cluster %s started (pid %d)", name, os.getpid())
    try:
        return agent.run()
    finally:
        log.info("agent for cluster %s stopped", name)
