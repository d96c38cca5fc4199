"""The per-cluster background agent: keeps provisioning (and recovery) going after the
CLI exits.

One process per cluster, started by `hp create` and restarted by any hp command that
finds it gone (`ensure_agent`). Per cluster rather than per host: a cluster's agent
holds only that cluster's lock, so a crash or a slow Docker call in one cluster never
stalls another, and deleting a cluster is just stopping its agent. An idle agent
sleeps on a condition (woken by Docker events, SIGUSR1 from `hp scale`, or a slow
resync) and costs no measurable CPU.

Crash-safety: the agent keeps nothing in memory that matters. Desired counts are in
SQLite, what exists is read from Docker labels, container names are deterministic
(`hp-<cluster>-<node>`: creating one twice fails), and retry counts and timeouts are
derived from the node status history. SIGKILL at any moment, start again: it resumes.
"""
from __future__ import annotations

import fcntl
import logging
from contextlib import contextmanager
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from .cluster import NODE_ROLES, ONSTART_REASON, Cluster, Env, Launcher
from .errors import HpError, LaunchError, OperationFailed
from .lifecycle import Backoff, History, allowed
from .naming import L_GROUP, L_INDEX, L_NODE, L_ROLE, container_name, node_name
from .provider import ContainerInfo
from .slurm import SlurmNode
from .spec import InstanceGroup

log = logging.getLogger("hp.agent")

REGISTER_TIMEOUT = float(os.environ.get("HP_REGISTER_TIMEOUT", "60"))
RESYNC = 10.0  # slow periodic resync: a safety net, events do the real work
BACKOFF = Backoff(initial=1.0, maximum=float(os.environ.get("HP_RETRY_MAX", "10")))


# -- process management (used by the CLI) --------------------------------------------------
def _paths(env: Env, name: str) -> tuple[Path, Path, Path]:
    d = env.store.home / "clusters" / name
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d / "agent.lock", d / "agent.pid", d / "agent.log"


@contextmanager
def creation_lock(env: Env, name: str) -> Iterator[None]:
    """Held by `hp create` while it makes the cluster: an agent started meanwhile (by
    `hp nodes` in another terminal) would see it as alive and not start."""
    lock, _, _ = _paths(env, name)
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def agent_pid(env: Env, name: str) -> int | None:
    """The live agent's pid, or None. Alive means: it holds the cluster's lock."""
    lock, pidf, _ = _paths(env, name)
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(pidf.read_text().strip())
            except (OSError, ValueError):
                return -1
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def ensure_agent(env: Env, name: str) -> dict[str, Any]:
    """Start the cluster's agent if it is not running. Returns its status."""
    row = env.store.cluster(name)
    if row is None or row.status in ("Deleting", "Failed", "RollingBack"):
        return {"Alive": False, "Pid": None, "Restarted": False}
    pid = agent_pid(env, name)
    if pid is not None:
        return {"Alive": True, "Pid": pid, "Restarted": False}
    _, _, logf = _paths(env, name)
    with open(logf, "ab") as out:
        p = subprocess.Popen([sys.executable, "-m", "orchestrator.agent", name], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=out, start_new_session=True, close_fds=True,
                             env={**os.environ, "HP_HOME": str(env.store.home)})
    return {"Alive": True, "Pid": p.pid, "Restarted": True}


def poke(env: Env, name: str) -> None:
    """Wake the agent now (after a spec change)."""
    pid = agent_pid(env, name)
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def stop_agent(env: Env, name: str, timeout: float = 10.0) -> None:
    pid = agent_pid(env, name)
    if not pid or pid < 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while agent_pid(env, name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if agent_pid(env, name) is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.1)


# -- the reconciler -------------------------------------------------------------------------
class Recorder:
    """Writes phase changes (validated against the transition table) and one event per change."""

    def __init__(self, cluster: Cluster):
        self.c = cluster

    def history(self, node: str) -> History:
        return History(self.c.store.node_history(self.c.name, node))

    def set(self, group: str, node: str, phase: str, message: str = "", *, level: str = "Info",
            event: str | None = None, node_id: str | None = None) -> None:
        h = self.history(node)
        if h.phase == phase and h.rows and h.rows[-1][1] == message:
            return
        if not allowed(h.phase, phase):
            log.error("refused transition %s: %s -> %s (%s)", node, h.phase, phase, message)
            return
        self.c.store.node_status(self.c.name, node, phase, message)
        if event:
            self.c.store.event(self.c.name, "Instance", level, event, group, node_id, node)


class GroupReconciler:
    """Brings one instance group to its target count. Observes (containers, Slurm,
    history), then acts; each step is idempotent."""

    def __init__(self, cluster: Cluster, group: str, launcher: Launcher, onstart: "OnStartQueue | None" = None):
        self.c = cluster
        self.group = group
        self.launcher = launcher
        self.rec = Recorder(cluster)
        self.onstart = onstart

    def step(self, snodes: dict[str, SlurmNode] | None) -> float:
        """One pass; returns how long until the next pass is needed."""
        # The target and the nodes' phases come from one snapshot: a delete-nodes request
        # writes its marks and the lower target together, and is seen whole.
        row, latest_all = self.c.store.snapshot(self.c.name)
        if row is None:
            return RESYNC
        g = self.c.reload(row.spec).group(self.group)
        if g is None or g.node_type == "Controller":
            return RESYNC
        prefix = self.group.lower()
        latest = {n: v for n, v in latest_all.items() if n.rsplit("-", 1)[0] == prefix}
        now = time.time()
        mine = {c.labels[L_NODE]: c for c in self.c.p.containers(self.c.name, {L_GROUP: self.group})
                if L_NODE in c.labels and c.labels.get(L_ROLE) in NODE_ROLES}
        phase = {n: v[0] for n, v in latest.items()}
        nxt = RESYNC
        # 1. passive sync: what became of launching nodes, and nodes being removed
        active: dict[str, ContainerInfo] = {}
        for n, ci in mine.items():
            if phase.get(n) == "ShuttingDown":
                nxt = min(nxt, self._remove(g, n, ci, snodes))
                continue
            active[n] = ci
            nxt = min(nxt, self._sync(g, n, ci, self.rec.history(n), snodes, now))
        # 2. scale down: extra nodes, idle and broken ones first
        extra = len(active) - g.InstanceCount
        if extra > 0:
            # only nodes the reconciler owns: one under a health check or recovery is left
            # to finish (the next pass picks again)
            owned = {n: ci for n, ci in active.items()
                     if phase.get(n) in (None, "Queued", "Launching", "LaunchFailed", "Running")}
            victims = self._pick_victims(owned, snodes, min(extra, len(owned)))
            if not victims:
                return min(nxt, 2.0)
            for n in victims:
                self.rec.set(self.group, n, "ShuttingDown", "scale-down", event=f"Instance {n} in cluster {self.c.name} "
                             f"and instance group {self.group} is being removed (scale-down to {g.InstanceCount})")
            return 0.1
        # 3. scale up: launch missing nodes whose retry is due. A node being rebooted or
        # replaced may have no container for a moment: recovery owns it, it is not missing.
        recovering = {n for n, (p, _, t) in latest.items()
                      if p in ("Rebooting", "Replacing") and n not in mine and now - t < 120}
        missing = g.InstanceCount - len(active) - len(recovering)
        used = {int(ci.labels.get(L_INDEX, "0")) for ci in mine.values()} | {int(n.rsplit("-", 1)[1]) for n in recovering}
        free = [i for i in range(1, g.InstanceCount + len(mine) + 2) if i not in used]
        wanted = free[:max(missing, 0)]
        self._close_stale(latest, set(mine), {node_name(self.group, i) for i in wanted})
        due = []
        for i in wanted:
            n = node_name(self.group, i)
            h = self.rec.history(n)
            if h.retry_due(now, BACKOFF):
                due.append(i)
            else:
                nxt = min(nxt, (h.next_retry(BACKOFF) or now) - now)
        if due:
            self._launch(g, due)
            nxt = min(nxt, 0.3)
        return max(nxt, 0.05)

    def _sync(self, g: InstanceGroup, n: str, ci: ContainerInfo, h: History,
              snodes: dict[str, SlurmNode] | None, now: float) -> float:
        phase = h.phase
        sn = (snodes or {}).get(n)
        if (phase == "Running" and g.OnStartDeepHealthChecks and self.onstart is not None and sn is not None
                and sn.reason == ONSTART_REASON and not sn.not_responding):
            self.onstart.add(n)  # came back (rebooted or replaced by recovery) drained for its on-start check
            return RESYNC
        if phase not in (None, "Queued", "Launching", "LaunchFailed"):
            return RESYNC  # running, or under recovery / health check: not the reconciler's business
        if ci.state == "created":  # left by a crash between create and start
            if err := self.launcher.start(ci.id):
                self._failed(g, n, err, ci)
                return 0.5
            self.rec.set(self.group, n, "Launching", "container started")
            return 0.3
        if ci.state in ("exited", "dead"):
            tail = self.c.p.logs(ci.id, tail=3).strip().replace("\n", " | ")[-300:]
            self._failed(g, n, LaunchError("ContainerExited", f"container exited with code {ci.exit_code} at start: "
                                           f"{tail}", retryable=True), ci)
            return 0.5
        if ci.state != "running":
            return 0.5
        if phase != "Launching":
            self.rec.set(self.group, n, "Launching", "container running, waiting for slurmd")
        if g.node_type == "Login":
            if self.c.p.exec(ci.id, ["scontrol", "ping"]).exit_code == 0:
                self._joined(g, n, ci)
                return RESYNC
        elif sn is not None and not sn.not_responding:
            self._joined(g, n, ci)
            return RESYNC
        started = h.since if phase == "Launching" and h.since else now
        if now - started > REGISTER_TIMEOUT:
            self._failed(g, n, LaunchError("RegistrationTimeout", f"slurmd on {n} did not register within "
                                           f"{REGISTER_TIMEOUT:g} s", retryable=True), ci)
            return 0.5
        return 0.3

    def _joined(self, g: InstanceGroup, n: str, ci: ContainerInfo) -> None:
        from .naming import node_id

        self.rec.set(self.group, n, "Running", "", node_id=node_id(ci.id),
                     event=f"Instance {node_id(ci.id)} ({n}) in cluster {self.c.name} and instance group "
                           f"{self.group} is running and joined Slurm"
                           + (" (drained until its on-start health checks pass)" if g.OnStartDeepHealthChecks else ""))
        if g.OnStartDeepHealthChecks and g.node_type == "Compute" and self.onstart is not None:
            self.onstart.add(n)

    def _failed(self, g: InstanceGroup, n: str, err: LaunchError, ci: ContainerInfo | None) -> None:
        if ci is not None:
            self.c.p.remove_container(ci.id)  # a fresh container on the next try
        h = self.rec.history(n)
        level = "Warn" if err.code == "InsufficientCapacity" else "Error"
        retry = BACKOFF.delay(h.failures_since_running() + 1)
        self.rec.set(self.group, n, "LaunchFailed", f"{err} (retry {h.failures_since_running() + 1}, next in {retry:g} s)",
                     level=level, event=f"Instance creation in cluster {self.c.name} and instance group {self.group} "
                                        f"failed: {err}" if self._new_reason(h, err) else None)

    @staticmethod
    def _new_reason(h: History, err: LaunchError) -> bool:
        """One event per change: a retry failing for the same reason adds none."""
        return not (h.phase == "LaunchFailed" and h.rows[-1][1].startswith(f"{err.code}:"))

    def _launch(self, g: InstanceGroup, indices: list[int]) -> None:
        for i in indices:
            n = node_name(self.group, i)
            h = self.rec.history(n)
            if h.phase in (None, "Removed", "LaunchFailed", "Running"):
                self.rec.set(self.group, n, "Queued", "waiting for capacity")
        res = self.launcher.create_many([(g, i) for i in indices])
        for n, r in res.items():
            if isinstance(r, LaunchError):
                self._failed(g, n, r, None)
                continue
            if err := self.launcher.start(r):
                self._failed(g, n, err, None)
                self.c.p.remove_container(r)
                continue
            self.rec.set(self.group, n, "Launching", "container started")

    def _close_stale(self, latest: dict[str, tuple[str, str, float]], existing: set[str], wanted: set[str]) -> None:
        """Nodes with no container: one waiting to be launched that the target no longer
        needs is dropped; one left ShuttingDown (e.g. a crash after its container was
        removed) is closed."""
        for n, (phase, _, _) in latest.items():
            if n in existing:
                continue
            if phase in ("Queued", "LaunchFailed") and n not in wanted:
                self.rec.set(self.group, n, "Removed", "no longer needed (scaled down)")
            elif phase == "ShuttingDown":
                self.rec.set(self.group, n, "Removed", "its container is gone")

    def _pick_victims(self, active: dict[str, ContainerInfo], snodes: dict[str, SlurmNode] | None, k: int) -> list[str]:
        def rank(n: str) -> tuple[int, int]:
            sn = (snodes or {}).get(n)
            ci = active[n]
            if ci.state != "running" or sn is None or sn.not_responding:
                score = 0  # broken or not yet joined
            elif sn.base == "IDLE":
                score = 1
            else:
                score = 2  # running jobs: last
            return (score, -int(ci.labels.get(L_INDEX, "0")))

        return sorted(active, key=rank)[:k]

    def _remove(self, g: InstanceGroup, n: str, ci: ContainerInfo, snodes: dict[str, SlurmNode] | None) -> float:
        """Drain, wait for running jobs to end, delete from Slurm, then remove the container."""
        sn = (snodes or {}).get(n)
        slurm = self.c.slurm
        if sn is not None and ci.state == "running" and not sn.not_responding:
            if not sn.drained:
                slurm.update([n], "drain", "hp: removing node")
                return 0.2
            if sn.base in ("ALLOCATED", "MIXED", "COMPLETING"):
                return 1.0  # jobs still running: never killed
        if sn is not None:
            try:
                slurm.delete([n])
            except OperationFailed as e:
                log.warning("scontrol delete %s: %s", n, e)
        self.c.p.remove_container(ci.id)
        self.rec.set(self.group, n, "Removed", "removed", event=f"Instance {n} in cluster {self.c.name} and instance "
                     f"group {self.group} was removed")
        return 0.1


class OnStartQueue:
    """New nodes of groups with OnStartDeepHealthChecks, checked in batches on one
    thread (one health-check request per cluster at a time)."""

    def __init__(self, env: Env, name: str, stop: threading.Event):
        self.env, self.name, self.stop = env, name, stop
        self._nodes: list[str] = []
        self._pending: set[str] = set()  # queued or being checked: never twice
        self._cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True, name="on-start-checks").start()

    def add(self, node: str) -> None:
        with self._cv:
            if node in self._pending:
                return
            self._pending.add(node)
            self._nodes.append(node)
            self._cv.notify()

    def _run(self) -> None:
        from .health.onstart import ClusterBusy, check_new_nodes

        while not self.stop.is_set():
            with self._cv:
                while not self._nodes and not self.stop.is_set():
                    self._cv.wait(5)
                time.sleep(0)  # let nodes that joined together be checked together
            time.sleep(1.0)
            with self._cv:
                batch, self._nodes = self._nodes, []
            if not batch:
                continue
            try:
                check_new_nodes(Cluster(self.env, self.name), batch)
            except ClusterBusy:  # an on-demand check is running: try again soon
                time.sleep(5)
                with self._cv:
                    self._nodes = batch + self._nodes
                continue
            except Exception as e:  # noqa: BLE001 - the request failed and handed the nodes back, drained
                log.exception("on-start checks of %s", batch)
                self.env.store.event(self.name, "Cluster", "Error", f"On-start deep health checks of {', '.join(batch)} "
                                     f"could not run: {e}; the nodes stay drained (hp health-check start to retry)")
            with self._cv:
                self._pending -= set(batch)


class Agent:
    def __init__(self, env: Env, name: str):
        self.env = env
        self.name = name
        self.stop = threading.Event()
        self.wake = threading.Condition(threading.RLock())  # re-entrant: kicked from signal handlers
        self._woken = False

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
                    if ev.get("Action") in ("die", "start", "destroy", "oom", "create"):
                        self.kick()
                    if self.stop.is_set():
                        return
            except Exception as e:  # noqa: BLE001 - engine restarted: reconnect
                log.warning("event stream: %s", e)
                time.sleep(1)

    def _recovery(self) -> None:
        try:
            from .watch import RecoveryWatcher  # the recovery half of the agent
        except ImportError:
            return
        try:
            RecoveryWatcher(self.env, self.name).run(self.stop)
        except Exception:  # noqa: BLE001
            log.exception("recovery watcher stopped")

    def run(self) -> int:
        env = self.env
        images = env.images.refs()
        cluster = Cluster(env, self.name)
        threading.Thread(target=self._events, daemon=True, name="events").start()
        threading.Thread(target=self._recovery, daemon=True, name="recovery").start()
        recs: dict[str, GroupReconciler] = {}
        onstart = OnStartQueue(env, self.name, self.stop)
        due: dict[str, float] = {}
        last_updated = None
        while not self.stop.is_set():
            row = env.store.cluster(self.name)
            if row is None or row.status in ("Deleting", "Failed", "RollingBack"):
                log.info("cluster is %s: agent exits", row.status if row else "gone")
                return 0
            if row.updated != last_updated:
                last_updated = row.updated
                cluster.reload()
                due = {}
            now = time.monotonic()
            groups = [g.InstanceGroupName for g in cluster.spec.InstanceGroups if g.node_type != "Controller"]
            ready = [g for g in groups if due.get(g, 0) <= now]
            if ready:
                snodes = self._slurm_nodes(cluster)
                if snodes is None:  # controller down: nothing can join; recovery restarts it
                    for gname in ready:
                        due[gname] = now + 1
                    self._sleep(1)
                    continue
                for gname in ready:
                    rec = recs.setdefault(gname, GroupReconciler(cluster, gname, Launcher(cluster, images), onstart))
                    try:
                        due[gname] = now + rec.step(snodes)
                    except HpError as e:
                        log.warning("group %s: %s", gname, e)
                        due[gname] = now + 2
                    except Exception:  # noqa: BLE001 - one group's bug must not stop the others
                        log.exception("group %s", gname)
                        due[gname] = now + 5
                self._end_operations(cluster)
            wait = min([d - time.monotonic() for d in due.values()] + [1.0])
            self._sleep(max(wait, 0.05))
        return 0

    def _slurm_nodes(self, cluster: Cluster) -> dict[str, SlurmNode] | None:
        try:
            return {n.name: n for n in cluster.slurm.nodes()}
        except Exception:  # noqa: BLE001 - controller down or restarting: unknown for now
            return None

    def _end_operations(self, cluster: Cluster) -> None:
        """Close scaling operations that converged; in all-or-nothing mode, roll back a
        scale-up that could not be fully provisioned (the group returns to its previous
        count and the nodes it started are removed)."""
        store = self.env.store
        ops = store.operations(self.name)
        row = store.cluster(self.name)
        if not ops and (row is None or row.status != "Creating"):
            return
        latest = store.latest_node_status(self.name)

        def phases(g: InstanceGroup) -> list[tuple[str, str]]:
            return [(p, m) for n, (p, m, _) in latest.items() if n.rsplit("-", 1)[0] == g.InstanceGroupName.lower()]

        for op in ops:
            g = cluster.spec.group(op["group"])
            if g is None:
                store.end_operation(op["id"], "Failed", "group no longer exists")
                continue
            ph = phases(g)
            failed = [m for p, m in ph if p == "LaunchFailed"]
            if failed and not cluster.spec.continuous and op["kind"] == "Scale" and op["previous"] is not None:
                msg = (f"Scaling instance group {g.InstanceGroupName} in cluster {self.name} to {op['target']} failed "
                       f"(all-or-nothing), rolling back to {op['previous']}: {failed[0]}")

                def revert(spec: dict[str, Any], prev: int = op["previous"], gname: str = g.InstanceGroupName) -> dict[str, Any]:
                    for ig in spec["InstanceGroups"]:
                        if ig["InstanceGroupName"] == gname:
                            ig["InstanceCount"] = prev
                    return spec

                store.update_spec(self.name, revert)
                store.end_operation(op["id"], "Failed", msg)
                store.event(self.name, "InstanceGroup", "Error", msg, g.InstanceGroupName)
                cluster.reload()
                continue
            running = sum(1 for p, _ in ph if p == "Running")
            busy = any(p in ("Queued", "Launching", "LaunchFailed", "ShuttingDown") for p, _ in ph)
            if running == g.InstanceCount and not busy:
                store.end_operation(op["id"], "Succeeded")
                store.event(self.name, "InstanceGroup", "Info", f"{op['kind']} of instance group "
                            f"{g.InstanceGroupName} in cluster {self.name} completed: {running} node(s)",
                            g.InstanceGroupName)
        if row is not None and row.status == "Creating":
            done = all(sum(1 for p, _ in phases(g) if p == "Running") >= g.InstanceCount
                       for g in cluster.spec.InstanceGroups if g.node_type != "Controller")
            if done:
                store.set_status(self.name, "InService")
                store.event(self.name, "Cluster", "Info", f"Cluster {self.name} is InService")


def main() -> int:
    name = sys.argv[1]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    env = Env()
    lock, pidf, _ = _paths(env, name)
    f = open(lock, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another agent holds this cluster
    pidf.write_text(str(os.getpid()))
    agent = Agent(env, name)
    signal.signal(signal.SIGTERM, lambda *_: (agent.stop.set(), agent.kick()))
    signal.signal(signal.SIGUSR1, lambda *_: agent.kick())
    log.info("agent for cluster %s started (pid %d)", name, os.getpid())
    try:
        return agent.run()
    finally:
        log.info("agent for cluster %s stopped", name)


if __name__ == "__main__":
    sys.exit(main())
