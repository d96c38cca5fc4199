"""`hp upgrade NAME --slurm RELEASE`: a running cluster moved onto a newer Slurm release
(HyperPod's UpdateClusterSoftware), in the order Slurm's upgrade guide gives
(slurm.schedmd.com/upgrades.html): slurmdbd and its database, then slurmctld with its
saved state, then login nodes, then compute nodes in rolling batches.

`start` checks the request (every problem named at once, nothing changed), records it as
an operation of the cluster (kind `Upgrade`; its releases and batch size in the store's
kv table under `upgrade:<id>`) and returns; the cluster's agent does the work
(`Upgrading`, a controller on its runtime). Every step is derived from what exists: a
node is on the new release when its container runs the new release's image (the tag
says: `hp-worker:26.05-<hash>`), a worker is being upgraded when Slurm shows it drained
with UPGRADE_REASON. An agent killed at any point resumes where that leaves it.

- The controller's container (slurmctld, and with Accounting slurmdbd and MariaDB) is
  stopped cleanly (`scontrol shutdown slurmctld`: slurmctld saves its state, the
  assoc_usage file 26.05 needs among it; its entry then stops slurmdbd and MariaDB),
  removed and made again on the new release's controller image with the same volumes
  (StateSaveLocation, MariaDB's data) through the one launch path (core/launcher.py).
  Its entry starts MariaDB, then slurmdbd, which converts the database, then slurmctld,
  which reads the saved state. Jobs keep running on their nodes meanwhile; new ones
  are refused until slurmctld answers (sbatch retries).
- Login nodes, then workers `batch` at a time, are replaced (recovery/actions.py
  `replace`, with the new release's images): a worker is drained first and replaced
  once its jobs ended, so no job is killed. A node whose replacement fails is tried
  again (MAX_TRIES in all), then reported and the operation ends Failed: the agent's
  provisioning launches the node again on the images it runs, never leaves it drained.
- At the end the cluster's SlurmVersion is the new release (`hp describe`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from .. import releases, waits
from ..core.context import Cluster, Env, parallel
from ..core.launcher import Launcher
from ..docker.views import LOCAL_ENGINE, Container, ContainerSpec
from ..errors import TRANSIENT, BadInput, LaunchError, OperationFailed
from ..naming import container_name, database_volume, labels
from ..recovery import actions
from ..releases import SlurmRelease
from ..runtime import Controller, Result
from ..services.accounting import controller_files, service_containers
from ..slurm.conf import render
from ..slurm.model import REASON_PREFIX, SlurmNode
from ..state.operations import Operation, OperationKind, OperationStatus
from ..state.phases import NodePhase, Owner, Phase, allowed, owner_of
from ..state.transitions import ClusterStatus

log = logging.getLogger("hp.upgrade")

KIND = OperationKind.UPGRADE
# Slurm's upgrade guide: a release accepts the state files, RPCs and database of the
# releases of the previous 18 months (26.05: 25.11, 25.05 and 24.11); releases come every
# six months (YY.05, YY.11).
RELEASES_BACK = 3
MAX_TRIES = 3  # replacements of one node before the upgrade reports it and stops
IDLE_POLL_S = 2.0  # how often an agent without an upgrade looks for one (one SQLite read)
STEP_POLL_S = 1.0  # while nodes drain
CONTROLLER_STOP_S = 60.0  # slurmctld's clean shutdown (state saved) and its entry's exit
CONTROLLER_UP_S = 300.0  # slurmdbd converts the database before slurmctld starts
NODE_UP_S = 120.0


def reason(to: str) -> str:
    """hp's drain reason of a worker being upgraded."""
    return f"{REASON_PREFIX} upgrading to Slurm {to}"


def why(to: str) -> str:
    """Why a node is replaced by the upgrade (its status and events say it)."""
    return f"upgrade to Slurm {to}"


def ordinal(release: str) -> int:
    """A release's place in Slurm's six-monthly series (24.11 -> 49, 25.05 -> 50)."""
    year, month = release.split(".")
    return int(year) * 2 + (0 if month == "05" else 1)


def release_of(image: str) -> str | None:
    """The Slurm release an hp node image's tag names (`hp-worker:26.05-<hash>`: 26.05)."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    head = tag.split("-", 1)[0]
    return head if head in SlurmRelease._value2member_map_ else None


def upgraded(c: Container, to: str) -> bool:
    """A node is on release `to` when its container runs that release's image: one that
    exited (a replacement that did not come up), or one made and never started (its agent
    killed in between), is not, and is replaced again."""
    return release_of(c.image) == to and c.running


def params(env: Env, op: Operation) -> dict[str, Any]:
    return json.loads(env.store.get(f"upgrade:{op.id}") or "{}")


def active(env: Env, name: str) -> Operation | None:
    return next((op for op in env.store.operations(name) if op.kind == KIND), None)


def jump_problem(frm: str, to: str) -> str | None:
    """Why Slurm cannot go from `frm` to `to` in one upgrade (None: it can)."""
    if to == frm:
        return f"the cluster already runs Slurm {frm}"
    if ordinal(to) < ordinal(frm):
        return f"Slurm {to} is older than the cluster's {frm}: Slurm cannot be downgraded (its state and database are {frm}'s)"
    if ordinal(to) - ordinal(frm) > RELEASES_BACK:
        return (
            f"Slurm {to} does not read the state or database of {frm}: it accepts those of the "
            f"{RELEASES_BACK} releases before it only; upgrade through a release between them"
        )
    return None


def problems(env: Env, name: str, to: object, batch_size: int) -> list[str]:
    """Every reason not to upgrade cluster `name` to release `to` (empty: go ahead)."""
    out = []
    row = env.store.cluster(name)
    if row is None:
        return [f"cluster {name!r} does not exist (see 'hp list')"]
    cluster = Cluster(env, name)
    frm = cluster.spec.release.value
    if bad := releases.problem(to, "--slurm"):
        out.append(bad)
    elif why := jump_problem(frm, str(to)):
        out.append(why)
    if batch_size < 1:
        out.append(f"--batch-size must be at least 1, got {batch_size}")
    if row.status != ClusterStatus.IN_SERVICE:
        out.append(f"cluster {name!r} is {row.status}: only an InService cluster can be upgraded")
    if (op := active(env, name)) is not None:
        p = params(env, op)
        out.append(f"cluster {name!r} is already being upgraded to Slurm {p.get('To', '?')} (operation {op.id})")
    if custom := [g.InstanceGroupName for g in cluster.spec.InstanceGroups if g.Image]:
        out.append(
            f"instance group(s) {', '.join(custom)} run an image of their own: hp cannot move it to another release"
        )
    if not out:
        images = env.images(SlurmRelease(str(to)))
        try:
            missing = sorted(r for r in images.refs(env.node_image_defs()).values() if not images.exists(r))
        except OperationFailed:  # not even its base image
            missing = [f"{to}'s base image"]
        if missing:
            out.append(
                f"Slurm {to}'s node images are not built ({', '.join(missing)}): run 'hp images build --slurm {to}'"
            )
    return out


def start(env: Env, name: str, to: str, batch_size: int = 1) -> dict[str, Any]:
    """Check and record the upgrade; the agent does it. BadInput (exit 2) naming every problem."""
    if found := problems(env, name, to, batch_size):
        raise BadInput(found, f"cannot upgrade cluster {name!r}")
    frm = Cluster(env, name).spec.release.value
    op = env.store.add_operation(name, "", KIND)
    doc = {"From": frm, "To": to, "BatchSize": batch_size}
    env.store.put(f"upgrade:{op}", json.dumps(doc))
    env.store.event(
        name, "Cluster", "Info", f"Upgrade of cluster {name} from Slurm {frm} to {to} started (batches of {batch_size})"
    )
    env.agents.ensure(name)
    env.agents.poke(name)
    return {"ClusterName": name, "OperationId": op, **doc}


def progress(env: Env, name: str) -> dict[str, Any]:
    """Where the cluster's newest upgrade stands: per group, how many nodes run which release."""
    ops = [op for op in env.store.operations(name, active_only=False) if op.kind == KIND]
    if not ops:
        return {"ClusterName": name, "Status": "None"}
    op = ops[-1]
    p = params(env, op)
    cluster = Cluster(env, name)
    groups: dict[str, dict[str, int]] = {}
    for c in cluster.node_containers().values():
        g = groups.setdefault(c.group, {"Nodes": 0, "Upgraded": 0})
        g["Nodes"] += 1
        g["Upgraded"] += upgraded(c, p.get("To", ""))
    return {
        "ClusterName": name,
        "OperationId": op.id,
        "Status": op.status.value,
        "Message": op.message or "",
        **p,
        "Groups": groups,
    }


class Upgrading(Controller):
    """The agent's side: one step of the cluster's active upgrade per reconcile."""

    kind = "upgrade"
    backoff = (2.0, 5.0, 10.0)

    def __init__(self, env: Env, name: str):
        self.env, self.name = env, name

    def reconcile(self, key: str) -> Result:
        op = active(self.env, self.name)
        if op is None:
            return Result(IDLE_POLL_S)
        p = params(self.env, op)
        to = SlurmRelease(p["To"])
        cluster = Cluster(self.env, self.name)
        refs = self.env.images(to).refs(self.env.node_image_defs())
        if cluster.spec.packages and not self._packages(cluster, op, refs, to):
            return Result(IDLE_POLL_S)
        nodes = cluster.node_containers()
        ctl = nodes.get(cluster.controller_node)
        if ctl is None or release_of(ctl.image) != to:
            self._controller(cluster, op, ctl, refs, to)
            return Result(0.0)
        if self._phase(cluster.controller_node) == Phase.REPLACING:  # made by an agent killed before it answered
            self._controller_up(cluster, op, ctl.id, to, time.monotonic())
            return Result(0.0)
        # a node whose replacement began (its container removed) in an agent killed before the
        # new one was made: launched on the new release now, not left Pending with no container
        latest = cluster.store.latest_phases(self.name)
        replacing = actions.replacing(why(to))

        def ours(rec: NodePhase) -> bool:  # the record of a node this upgrade is replacing
            return rec.phase is Phase.REPLACING and rec.message == replacing

        cut = sorted(n for n, rec in latest.items() if n not in nodes and n != cluster.controller_node and ours(rec))
        if cut:
            self._replace(cluster, op, cut, refs, to, {})
            return Result(0.0)
        # a node another actor holds now (recovery rebooting a container that died, a health
        # check, its removal) is left to it and looked at again once it is done: never two
        # actors on one node (seen: recovery rebooting a killed 26.05 container while the
        # upgrade replaced it). Provisioning's nodes (a launch that failed) are the upgrade's
        # to replace, as before.
        now = time.time()
        held = {
            n
            for n, rec in latest.items()
            if owner_of(rec, now) in (Owner.RECOVERY, Owner.HEALTH, Owner.REMOVAL) and not ours(rec)
        }
        behind = {n: c for n, c in nodes.items() if c.role in ("login", "worker") and not upgraded(c, to)}
        login = sorted(n for n, c in behind.items() if c.role == "login" and n not in held)
        if login:
            self._replace(cluster, op, login, refs, to, {n: nodes[n].group for n in login})
            return Result(0.0)
        workers = {n: c for n, c in behind.items() if c.role == "worker" and n not in held}
        if workers:
            return self._workers(cluster, op, workers, refs, to, int(p.get("BatchSize", 1)))
        if behind:  # only nodes someone else holds are left
            return Result(STEP_POLL_S)
        self._finish(cluster, op, p)
        return Result(IDLE_POLL_S)

    def _packages(self, cluster: Cluster, op: Operation, refs: dict[str, str], to: str) -> bool:
        """The cluster's NodePackages images derived from the new release's (built once: the
        first step, before any node is touched; a build apt refuses ends the upgrade Failed
        with apt's words, nothing changed). False when it ended."""
        images = self.env.images(SlurmRelease(to))
        if all(images.exists(r) for r in images.with_packages(refs, cluster.spec.packages).values()):
            return True
        self._event(cluster, "Info", f"Building the NodePackages images on Slurm {to}", None, None)
        try:
            images.build_packages(refs, cluster.spec.packages, log=lambda line: log.info("%s", line))
        except OperationFailed as e:
            msg = f"Upgrade of cluster {self.name} stopped: its NodePackages could not be built on Slurm {to}: {e}"
            self.env.store.end_operation(op.id, OperationStatus.FAILED, msg)
            self._event(cluster, "Error", msg, None, None)
            return False
        return True

    # -- the controller: slurmdbd and its database, then slurmctld --------------------
    def _controller(
        self, cluster: Cluster, op: Operation, ctl: Container | None, refs: dict[str, str], to: str
    ) -> None:
        store, node = cluster.store, cluster.controller_node
        group = cluster.spec.controller.InstanceGroupName
        if allowed(self._phase(node), Phase.REPLACING):  # recovery leaves it alone meanwhile
            store.set_phase(self.name, node, Phase.REPLACING, f"upgrading to Slurm {to}")
        t0 = time.monotonic()
        if ctl is not None:
            what = "slurmdbd, its database and slurmctld" if cluster.spec.accounting else "slurmctld"
            self._event(
                cluster, "Info", f"Controller {node}: {what} stopping to be upgraded to Slurm {to}", group, node
            )
            if ctl.running:
                try:
                    cluster.slurm.shutdown_controller()  # state saved (assoc_usage too) before it exits
                except OperationFailed as e:
                    log.warning("slurmctld did not take the shutdown: %s", e)
                if not waits.poll(
                    lambda: not cluster.p.inspect(ctl.id).state.running, bool, every=0.5, timeout=CONTROLLER_STOP_S
                ):
                    self._event(
                        cluster,
                        "Warning",
                        f"Controller {node} did not stop within {CONTROLLER_STOP_S:g} s: killed",
                        group,
                        node,
                    )
            cluster.p.remove_container(ctl.id)
        if cluster.spec.accounting:  # on the controller's host: its database's volume is there
            host = ctl.host if ctl is not None else cluster.placements().get(node, LOCAL_ENGINE)
            self._database_owner(cluster, refs["controller"], host)
        launcher = Launcher(cluster, refs)
        files = {
            "slurm.conf": (render(cluster.spec, cluster.env.catalogue).encode(), 0o644, 0),
            **controller_files(cluster),
        }
        cid = launcher.create_many([(cluster.spec.controller, 1)], files=files)[node]
        if isinstance(cid, LaunchError):
            self._tried(cluster, op, node, f"its controller could not be made on Slurm {to}: {cid}")
            raise OperationFailed(f"controller {node} on Slurm {to}: {cid}")
        if (err := launcher.start(cid)) is not None:
            self._tried(cluster, op, node, f"its controller could not be started on Slurm {to}: {err}")
            cluster.p.remove_container(cid)
            raise OperationFailed(f"controller {node} on Slurm {to}: {err}")
        self._controller_up(cluster, op, cid, to, t0)

    def _database_owner(self, cluster: Cluster, image: str, host: str) -> None:
        """MariaDB's data files given to the new image's mysql user: its uid is whatever
        the Debian suite's packages gave it (trixie's 997, forky's 996), and a MariaDB that
        cannot write its files does not start ('ibdata1 must be writable'). A short-lived
        container of the new image, the database's volume mounted, no network."""
        spec = ContainerSpec(
            name=container_name(self.name, "db-owner"),
            image=image,
            labels=labels(self.name, "db-owner"),
            network="none",
            volumes={database_volume(self.name): "/var/lib/mysql"},
            entrypoint=["sh", "-c", "chown -R mysql:mysql /var/lib/mysql"],
            memory_bytes=64 << 20,
            init=False,
            host=host,
        )
        cluster.p.remove_container(spec.name)  # one left by an agent killed while it ran
        res = cluster.p.run_once(spec, timeout=60)
        if res.exit_code != 0:
            raise OperationFailed(
                f"the database's files could not be given to Slurm {image}'s MariaDB: {res.output[-300:]}"
            )

    def _phase(self, node: str) -> Phase | None:
        return self.env.store.latest_phases(self.name).phase(node)

    def _controller_up(self, cluster: Cluster, op: Operation, cid: str, to: str, t0: float) -> None:
        """The new controller started and answering; on failure its container is removed
        (the next try makes it again)."""
        store, node = cluster.store, cluster.controller_node
        group = cluster.spec.controller.InstanceGroupName
        if not cluster.p.inspect(cid).state.running:  # made, never started (an agent killed in between)
            cluster.p.start(cid)
        up = waits.poll(cluster.slurm.ping, bool, every=0.5, timeout=CONTROLLER_UP_S)
        if not up:
            err = f"slurmctld did not answer within {CONTROLLER_UP_S:g} s"
            self._tried(cluster, op, node, f"its controller could not be brought up on Slurm {to}: {err}")
            cluster.p.remove_container(cid)
            raise OperationFailed(f"controller {node} on Slurm {to}: {err}")
        store.set_phase(self.name, node, Phase.RUNNING, f"upgraded to Slurm {to}")
        self._event(
            cluster, "Info", f"Controller {node} runs Slurm {to} (back in {time.monotonic() - t0:.1f} s)", group, node
        )
        actions.reregister_lost(cluster)

    # -- login and compute nodes ------------------------------------------------------
    def _workers(
        self,
        cluster: Cluster,
        op: Operation,
        todo: dict[str, Container],
        refs: dict[str, str],
        to: str,
        batch: int,
    ) -> Result:
        snodes = {n.name: n for n in cluster.slurm.nodes()}
        mine = reason(to)
        draining = sorted(n for n in todo if (s := snodes.get(n)) is not None and s.drained_for(mine))
        fresh = [n for n in sorted(todo) if n not in draining]
        more = fresh[: max(batch - len(draining), 0)]
        ready_now = [n for n in more if snodes.get(n) is None]  # not in Slurm: nothing to drain
        to_drain = [n for n in more if n not in ready_now]
        if to_drain:
            cluster.slurm.drain(to_drain, mine)
            for n in to_drain:
                self._event(cluster, "Info", f"Instance {n} drained to be upgraded to Slurm {to}", todo[n].group, n)
            draining += to_drain
        # replaced once Slurm shows it drained with nothing running or completing on it
        done = [n for n in draining if n not in to_drain and self._empty(cluster, snodes[n])] + ready_now
        if done:
            self._replace(cluster, op, sorted(done), refs, to, {n: todo[n].group for n in done})
            return Result(0.0)
        return Result(STEP_POLL_S)

    @staticmethod
    def _empty(cluster: Cluster, s: SlurmNode) -> bool:
        return s.emptied and not cluster.slurm.jobs_on(s.name)

    def _replace(
        self, cluster: Cluster, op: Operation, nodes: list[str], refs: dict[str, str], to: str, groups: dict[str, str]
    ) -> None:
        def one(n: str) -> bool:
            ok = actions.replace(cluster, n, why(to), NODE_UP_S, images=refs)
            if not ok:
                self._tried(cluster, op, n, f"its replacement on Slurm {to} did not come up", groups.get(n))
            return ok

        parallel(one, nodes)

    def _tried(self, cluster: Cluster, op: Operation, node: str, what: str, group: str | None = None) -> None:
        """Count a failed try at `node`; past MAX_TRIES the upgrade stops, Failed, naming it.
        The controller is tried again and again (each failure an Error event): the cluster
        has no other way back, its state being the new release's once slurmctld read it."""
        key = f"upgrade:{op.id}:tries:{node}"
        n = int(self.env.store.get(key) or "0") + 1
        self.env.store.put(key, str(n))
        if node == cluster.controller_node:
            self._event(cluster, "Error", f"Upgrade of {node}: {what} (try {n}); trying again", group, node)
            return
        if n < MAX_TRIES:
            # held Replacing until the next try: left LaunchFailed, the agent's provisioning
            # would take it meanwhile (remove its container, launch it on the old release),
            # racing the next try, or the upgrade would see no container and finish without it
            to = params(self.env, op)["To"]
            self.env.store.set_phase(self.name, node, Phase.REPLACING, actions.replacing(why(to)))
            self._event(
                cluster, "Warning", f"Upgrade of {node}: {what} (try {n} of {MAX_TRIES}); trying again", group, node
            )
            return
        msg = (
            f"Upgrade of cluster {self.name} stopped: {node}: {what} ({n} tries); the nodes not yet upgraded "
            "stay on their release and in service"
        )
        self._resume_ours(cluster, reason(params(self.env, op)["To"]))
        self.env.store.end_operation(op.id, OperationStatus.FAILED, msg)
        self._event(cluster, "Error", msg, group, node)

    def _resume_ours(self, cluster: Cluster, mine: str) -> None:
        """Workers the upgrade drained go back into service (never left drained without a word)."""
        try:
            ours = [n.name for n in cluster.slurm.nodes() if n.drained_for(mine)]
            cluster.slurm.resume(ours)
        except OperationFailed as e:
            log.warning("resuming the nodes drained for the upgrade: %s", e)

    def _finish(self, cluster: Cluster, op: Operation, p: dict[str, Any]) -> None:
        to = p["To"]

        def change(spec: dict[str, Any]) -> dict[str, Any]:
            spec["SlurmVersion"] = to
            return spec

        cluster.store.update_spec(self.name, change)
        took = time.time() - op.started
        msg = f"Upgrade of cluster {self.name} from Slurm {p['From']} to {to} completed in {took:.1f} s"
        cluster.store.end_operation(op.id, OperationStatus.DONE, msg)
        self._event(cluster, "Info", msg, None, None)
        # slurmrestd's container, if any, is made again on the new release by the services' watch
        try:
            if (rest := service_containers(cluster).get("rest")) is not None:
                cluster.p.remove_container(rest.id)
        except TRANSIENT as e:
            log.warning("slurmrestd's container: %s", e)

    def _event(self, cluster: Cluster, level: str, what: str, group: str | None, node: str | None) -> None:
        cluster.store.event(self.name, "Instance" if node else "Cluster", level, what, group, None, node)
