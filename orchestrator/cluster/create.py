"""`hp create`: a list of named actions (as kind's create), with progress reported per
action and per group, and one rollback path.

The actions: network, volumes and key; the controller (with Accounting, slurmdbd and
MariaDB in its container: its entry starts each daemon once the one it needs answers,
services/accounting.py), started on a thread; meanwhile the login and compute nodes,
recorded Queued, created through the reconciler's launch (reconciler.py: the agent's
launch path) and started at once on a thread (their entry runs the lifecycle script,
then waits for slurmctld to listen), GPU nodes and slurmrestd (Rest) the moment slurmctld
answers `scontrol ping`; then the same reconciler's passive sync, in-process, until the
nodes joined or the deadline passes. All-or-nothing: a node that cannot be provisioned
fails the create (and rolls it back); continuous: the create returns once the login
nodes are up, and the agent brings in the rest and retries what failed.

With registered hosts (core/across_hosts.py): the images are made present on every
host first (one stream from the local engine, fanned out); the network is a swarm
overlay (`--encrypt-network`: proven to carry traffic, else the create fails); each
node is placed on a host (core/placement.py) and started at once (its overlay attachment
overlaps the controller's boot); the /home file server starts on the controller's host
right after the controller.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from .. import waits
from ..core import capacity, placement
from ..core.across_hosts import ensure_fileserver, host_problems, placement_problems, prove_traffic
from ..core.context import Cluster, Env
from ..core.launcher import Launcher
from ..docker import images as image_sets  # read at each call: a test may narrow a set
from ..docker.views import LOCAL_ENGINE
from ..errors import BadInput, HpError, LaunchError, OperationFailed, WaitTimeout
from ..gpu.thresholds import thresholds_checked
from ..naming import (
    L_HOME,
    container_name,
    user_ids,
)
from ..services.accounting import CreateServices, controller_files, forget_secrets
from ..slurm.conf import render
from ..slurm.model import SlurmNode
from ..spec.model import ClusterSpec
from ..state.phases import Phase
from ..state.transitions import ClusterStatus
from .reconciler import GroupReconciler, Launch, Recorder, not_joined
from .teardown import other_home, remove_resources

log = logging.getLogger("hp")


class Progress(Protocol):
    def stage(self, name: str, detail: str = "") -> None: ...

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None: ...  # group -> (current, target, failed)


class NoProgress:
    def stage(self, name: str, detail: str = "") -> None:
        pass

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None:
        pass


@dataclass(frozen=True)
class Created:
    """What create made, and Slurm's nodes from the look that ended its wait (None when
    that pass asked Slurm nothing: only login nodes were left, or it did not wait): what
    the caller shows next needs no second query (cluster/query.py observe)."""

    cluster: Cluster
    slurm_nodes: dict[str, SlurmNode] | None = None


@dataclass
class CreateOptions:
    wait: bool = True
    timeout: float = 300.0
    retain: bool = False
    encrypt_network: bool = False  # registered hosts only: an IPsec-encrypted overlay


def check_name_free(env: Env, name: str) -> None:
    row = env.store.cluster(name)
    nets = env.provider.networks(name)
    existing = nets or env.provider.containers(name) or env.provider.volumes(name)
    if row is not None and not (row.status == ClusterStatus.FAILED and not existing):
        raise BadInput(
            f"a cluster named {name!r} already exists ({row.status}); "
            f"delete it first with 'hp delete {name}' or pick another --name",
            "name in use",
        )
    if row is None and existing:
        if owner := other_home(env, name, nets):
            raise BadInput(f"cluster {name!r} exists: it was made from another hp state folder, {owner}", "name in use")
        raise BadInput(
            f"Docker already holds resources labelled for cluster {name!r} "
            f"(left over from an earlier run?); remove them with 'hp delete {name}'",
            "name in use",
        )
    if row is not None:
        env.store.remove_cluster(name)  # a Failed cluster with nothing left: its name is free again


def has_gpus(spec: ClusterSpec, catalogue: Mapping) -> bool:
    return capacity.wants_gpus(catalogue, (g.InstanceType for g in spec.InstanceGroups))


def image_defs(spec: ClusterSpec, catalogue: Mapping | None = None, extra: tuple = ()) -> tuple:
    """The node images; the check images when a group checks new nodes on start; the
    GPU check image (checks and the passive GPU monitor) when a group has GPUs; slurmrestd's
    (Rest; Accounting runs in the controller's image); `extra`: those the provider's
    clusters need (docker/images.cluster_images: with registered hosts, the /home-mounting
    node image and the file server)."""
    defs = image_sets.NODE_IMAGES + tuple(d for d in image_sets.SERVICE_IMAGES if d.name == "rest" and spec.rest)
    defs += extra
    defs += image_sets.CHECK_IMAGES if any(g.OnStartDeepHealthChecks for g in spec.InstanceGroups) else ()
    return defs + (image_sets.GPU_IMAGES if catalogue is not None and has_gpus(spec, catalogue) else ())


def capacity_problems(
    env: Env | None, spec: ClusterSpec, pool: capacity.Pool | None = None, catalogue: Mapping | None = None
) -> list[str]:
    """Instance types the spec asks more of than the hosts could ever run (each host's
    whole pool, every other node gone; a node fits on one host, and a type's pool is
    the sum over the hosts its groups may use): refused before anything is made."""
    assert env is not None or pool is not None
    catalogue = catalogue if catalogue is not None else env.catalogue  # type: ignore[union-attr]
    per_host = (
        {LOCAL_ENGINE: pool}
        if pool is not None
        else capacity.pools(env.provider, env.store, has_gpus(spec, catalogue))[0]  # type: ignore[union-attr]
    )
    wanted: dict[str, tuple[int, set[str]]] = {}
    for g in spec.InstanceGroups:
        n, hosts = wanted.get(g.InstanceType, (0, set()))
        wanted[g.InstanceType] = (n + g.InstanceCount, hosts | set(placement.hosts_of(g, list(per_host))))
    problems = []
    for t, (n, hosts) in wanted.items():
        bounds = {h: capacity.ceiling(catalogue[t], per_host[h]) for h in per_host if h in hosts}
        most = sum(b[0] for b in bounds.values())
        if n <= most:
            continue
        if list(bounds) == [LOCAL_ENGINE]:
            problems.append(
                f"InsufficientCapacity: {n} node(s) of {t} are more than this host can ever run: {most} ({bounds[''][1]})"
            )
        else:
            per = ", ".join(f"{h}: {b[0]} ({b[1]})" for h, b in bounds.items()) or "no host available"
            problems.append(
                f"InsufficientCapacity: {n} node(s) of {t} are more than the hosts can ever run: {most} ({per})"
            )
    return problems


def create(env: Env, spec: ClusterSpec, opts: CreateOptions, progress: Progress = NoProgress()) -> Created:
    name = spec.ClusterName
    env.provider.ping()
    check_name_free(env, name)
    # fixed from now on (slurm.conf): the node slots, and whether the services run
    spec = spec.model_copy(update={"MaxNodeCount": spec.max_nodes}).with_services_fixed()
    problems = placement_problems(env, spec)
    if opts.encrypt_network and not env.provider.places_nodes:
        problems.append("--encrypt-network: a cluster on one engine has no traffic between hosts (hp hosts add)")
    if problems := problems or capacity_problems(env, spec):
        raise BadInput(problems, "cannot create")
    if has_gpus(spec, env.catalogue):
        thresholds_checked()  # a bad thresholds file is bad input: refused before anything is made
    # a registered host that cannot run the nodes is refused before any image is built
    if problems := host_problems(env, lambda s: progress.stage("hosts", s)):
        raise BadInput(problems, "cannot create")
    progress.stage("images", "checking node images")
    images = env.images(spec.release).build(
        image_defs(spec, env.catalogue, image_sets.cluster_images(env.provider)),
        log=lambda s: progress.stage("images", s),
    )
    # NodePackages: the login and compute images derived from hp's (the Launcher runs them)
    derived = env.images(spec.release).build_packages(images, spec.packages, log=lambda s: progress.stage("images", s))
    # on every host (one engine has them already): with the base image's tag (its layers
    # travel anyway), GPU discovery probes in it
    refs = sorted(set(images.values()) | set(derived.values()) | {env.images(spec.release).base(make=False)[0]})
    env.provider.prepare_images(refs, lambda s: progress.stage("images", s))
    mode = "continuous" if spec.continuous else "all-or-nothing"
    if not env.store.add_cluster(
        name, spec.model_dump(exclude_none=True), ClusterStatus.CREATING, f"{mode} provisioning"
    ):
        raise BadInput(f"a cluster named {name!r} already exists", "name in use")
    env.store.set_user_ids(name, *user_ids(os.environ, os.getuid(), os.getgid()))  # before any node
    cluster = Cluster(env, name, spec)
    with env.agents.creation_lock(name):  # no agent may act on the cluster while it is being made
        seen = _create_and_record(cluster, images, opts, progress)
    env.agents.ensure(name)  # provisioning retries and node recovery go on in the background
    return Created(cluster, seen)


def _create_and_record(
    cluster: Cluster, images: dict[str, str], opts: CreateOptions, progress: Progress
) -> dict[str, SlurmNode] | None:
    """The actions in order (one rollback path); Slurm's nodes from the look that ended
    the wait (Created)."""
    name = cluster.name
    making = Creating(cluster, images, opts, progress)  # makes nothing yet
    try:
        for action, run in making.actions():
            log.debug("create %s: %s", name, action)
            run()
        return making.joined_in
    except BaseException as e:  # every failure (^C too) ends in the one rollback path, then goes on up
        making.settle()  # nothing may still be making or starting a container while everything is removed
        msg = str(e) if isinstance(e, HpError) else f"{type(e).__name__}: {e}"
        if isinstance(e, KeyboardInterrupt):
            msg = "interrupted"
        rollback(cluster, msg, opts.retain, progress)
        raise


def rollback(cluster: Cluster, msg: str, retain: bool, progress: Progress) -> None:
    env, name = cluster.env, cluster.name
    # expect: nothing is written over a delete that began meanwhile
    if retain:
        env.store.set_status(name, ClusterStatus.FAILED, msg, expect=ClusterStatus.CREATING)
        return
    env.store.set_status(name, ClusterStatus.ROLLING_BACK, msg, expect=ClusterStatus.CREATING)
    progress.stage("rollback", "removing what was created")
    remove_resources(env.provider, name)
    cluster.key_path.unlink(missing_ok=True)  # nothing uses it any more
    forget_secrets(cluster)
    env.store.set_status(name, ClusterStatus.FAILED, msg, expect=ClusterStatus.ROLLING_BACK)


class Creating:
    """One cluster being made: its actions, in order, and what they share."""

    def __init__(self, cluster: Cluster, images: dict[str, str], opts: CreateOptions, progress: Progress):
        self.c, self.images, self.opts, self.progress = cluster, images, opts, progress
        self.deadline = time.monotonic() + opts.timeout
        self.services = CreateServices(cluster, images)
        self.launcher = Launcher(cluster, images)
        self.rec = Recorder(cluster)
        self.conf = b""
        self.ctl = ""  # the controller's container
        groups = [g for g in cluster.spec.InstanceGroups if g.node_type != "Controller"]
        self.types = {g.InstanceGroupName: g.node_type for g in groups}
        # the agent's reconcilers, one per group, driven here until the create is done
        self.recs = {
            g.InstanceGroupName: GroupReconciler(cluster, g.InstanceGroupName, self.launcher, announce=False)
            for g in groups
        }
        self.nodes = Launch(self.launcher, self.recs, [(g, i) for g in groups for i in range(1, g.InstanceCount + 1)])
        self.later: list[str] = []  # nodes started once slurmctld answers
        self.early: Future[None] | None = None  # nodes started while it boots
        self.making_controller: Future[str] | None = None
        self.joined_in: dict[str, SlurmNode] | None = None  # Slurm's nodes in the look that ended the wait

    def actions(self) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("network", self.network),
            ("controller", self.controller),
            ("nodes", self.make_nodes),
            ("controller started", self.controller_started),
            ("accounting", self.accounting),
            ("controller ready", self.controller_ready),
            ("start nodes", self.start_nodes),
            ("wait", self.wait),
        ]

    def settle(self) -> None:
        """Before a rollback: the services' containers being made on threads and the
        controller's start are waited for (their errors are not the one being handled);
        nodes still being started early record nothing more (the rollback removes their
        containers, which ends their starts: a lifecycle script is not waited for)."""
        self.services.settle()
        if self.making_controller is not None:
            wait([self.making_controller])
        self.nodes.stopped = True

    def network(self) -> None:
        """The network, the volumes (with registered hosts: made on the host of the
        container that mounts them) and the auth key."""
        c, p, name, opts = self.c, self.c.p, self.c.name, self.opts
        self.progress.stage("network", "network, volumes and auth key")
        # the state folder that made it: another one's `hp delete` leaves the cluster to it (delete.py)
        owner = {L_HOME: str(c.store.home.resolve())}
        p.prepare_cluster(name, owner, opts.encrypt_network, c.spec.accounting)
        if opts.encrypt_network:  # with registered hosts only (refused on one engine)
            self.progress.stage("network", "proving the encrypted overlay carries traffic between hosts")
            self.progress.stage("network", prove_traffic(c, self.images["worker"]))
        c.make_key()

    def controller(self) -> None:
        """The daemons the nodes need, made and started at once: the controller (its
        container made here, its capacity before any node's; started on a thread), with
        Accounting slurmdbd and its MariaDB in it (its entry starts slurmdbd once MariaDB
        answers, slurmctld once slurmdbd does); slurmrestd's container made meanwhile.

        Returns at once: the nodes start with the controller, with Accounting or without.
        Docker starts a few containers at a time, so node starts slow the controller's
        chain, but the nodes' own starts are the longer path (docs/benchmarks.md; with
        Accounting, 14 pairs: create 0.05-0.08 s sooner than when the nodes waited for
        the controller's start; without, 5 pairs: 4 bench.tiny workers 4.67 vs 5.32 s)."""
        spec = self.c.spec
        self.conf = render(spec, self.c.env.catalogue).encode()
        self.progress.stage("controller", self.c.controller_node)
        if spec.accounting:
            self.progress.stage("accounting", "slurmdbd and its database, in the controller's container")
        cid = self._create_controller()
        self.services.begin(self.conf)
        ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-controller")
        self.making_controller = ex.submit(self._start_controller, cid, self.images.get("fileserver"))
        ex.shutdown(wait=False)

    def make_nodes(self) -> None:
        """Every login and compute node Queued and its container made, while the
        controller starts and boots; they start at once, on a thread (their lifecycle
        scripts run meanwhile, and their daemons start when slurmctld listens:
        images/node/hp-entry). GPU nodes wait for gres.conf, which needs slurmctld: with
        any, the nodes are made once the controller's container started (their lines go
        into its gres.conf as they are made)."""
        if has_gpus(self.c.spec, self.c.env.catalogue):
            self.controller_started()
        made = self.nodes.create()
        gpus = self.launcher.gpu_cids
        early = [n for n, cid in made.items() if cid not in gpus]
        self.later = [n for n, cid in made.items() if cid in gpus]
        if early:
            ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-early-start")
            self.early = ex.submit(self.nodes.start, early)
            ex.shutdown(wait=False)

    def controller_started(self) -> None:
        """The controller's container started (its error is the create's)."""
        assert self.making_controller is not None
        self.ctl = self.making_controller.result()

    def accounting(self) -> None:
        """With Accounting: slurmdbd started in the controller's container (slurmctld waits
        for it there and registers the cluster at its first start); after the action
        "controller started", which set self.ctl."""
        self.services.accounting_ready(self.ctl, self.deadline)

    def controller_ready(self) -> None:
        """slurmctld answers. In continuous mode a controller that failed for a retryable
        reason is made again; otherwise its failure is the create's."""
        c, host = self.c, self.c.controller_node
        try:
            wait_controller(c, self.ctl, self.deadline)
        except LaunchError as e:
            if not (c.spec.continuous and e.retryable):
                if self.early is not None:  # their outcome (a lifecycle script's event) first
                    wait([self.early])
                raise OperationFailed(f"controller {host}: {e}") from None
            self.ctl = self._retry_controller(e)
        self.rec.set(c.spec.controller.InstanceGroupName, host, Phase.RUNNING, event=f"Controller {host} is up")

    def start_nodes(self) -> None:
        """slurmrestd and the nodes not started yet. All-or-nothing: a node that could not
        be launched fails the create."""
        self.progress.stage("nodes", "starting login and compute nodes")
        self.services.start_rest()
        self.nodes.start(self.later)
        if self.early is not None:
            self.early.result()
        if self.failures() and not self.c.spec.continuous:
            raise OperationFailed(self.shortage())

    def wait(self) -> None:
        """The groups' reconcilers until the nodes joined (continuous: the login nodes; the
        agent brings in the workers as they come, and retries what failed); then InService.
        Without --wait the agent marks it InService once every node joined."""
        logins = [r for r in self.recs.values() if self.types[r.group] == "Login"]
        workers = [r for r in self.recs.values() if self.types[r.group] == "Compute"]
        if self.c.spec.continuous:
            if self.opts.wait:
                self.progress.stage("wait", "waiting for the login node(s)")
                self._converge(logins)
            _in_service(self.c)
            return
        if not self.opts.wait:
            return
        self.progress.stage("wait", "waiting for nodes to be idle in Slurm")
        self._converge(workers + logins)
        _in_service(self.c)

    def failures(self) -> dict[str, LaunchError]:
        return {n: e for r in self.recs.values() for n, e in r.failures.items()}

    def shortage(self) -> str:
        by_group: dict[str, list[str]] = {}
        for n, e in self.failures().items():
            by_group.setdefault(self.nodes.rec_of[n].group, []).append(f"{n}: {e}")
        parts = [
            f"group {g} could not be fully provisioned ({len(v)} node(s)): " + "; ".join(v[:3])
            for g, v in by_group.items()
        ]
        return "all-or-nothing provisioning failed: " + " | ".join(parts)

    def _converge(self, recs: list[GroupReconciler]) -> None:
        """Drive these groups' passive sync until each node this create launched runs. A
        node that fails ends an all-or-nothing create; in continuous mode it is left to
        the agent. One Slurm query a pass while a compute node waits; a group's sync (its
        containers listed, its nodes' records read, for a login node an exec of `scontrol
        ping` there) runs every SYNC_EVERY passes (a container that exited, a register
        timeout), and besides: a compute group's when Slurm shows one of its waiting nodes
        responding, a login group's at every pass once no compute node is waiting, from
        the pass in which the last one joined (its join is seen only from its node)."""
        c, strict = self.c, not self.c.spec.continuous
        mine = {n for n, r in self.nodes.rec_of.items() if r in recs}
        target = {g.InstanceGroupName: g.InstanceCount for g in c.spec.compute}
        logins = [r for r in recs if self.types[r.group] == "Login"]
        computes = [r for r in recs if r not in logins]
        passes = itertools.count()

        def waiting(of: list[GroupReconciler]) -> dict[GroupReconciler, list[str]]:
            """The groups of `of` with nodes not running yet, and those nodes."""
            latest = c.store.latest_phases(c.name)
            out: dict[GroupReconciler, list[str]] = {}
            for n in mine:
                if latest.phase(n) is not Phase.RUNNING and self.nodes.rec_of[n] in of:
                    out.setdefault(self.nodes.rec_of[n], []).append(n)
            return out

        def joined() -> bool:
            every = next(passes) % SYNC_EVERY == 0
            left = waiting(computes)
            snodes = _slurm_nodes(c) if left else {}  # login nodes' joins are seen from them
            for r, theirs in left.items():
                if every or any(n in snodes and not snodes[n].not_responding for n in theirs):
                    r.sync(snodes)
            if logins:  # the compute nodes that joined in this pass: the login groups' turn in it too
                after = waiting(recs)
                workers_done = not any(r in computes for r in after)
                for r in (r for r in after if r in logins):
                    if every or workers_done:
                        r.sync(snodes)
            latest = c.store.latest_phases(c.name)
            running = {n for n in self.nodes.rec_of if latest.phase(n) is Phase.RUNNING}
            counts = {g: (sum(1 for n in running if self.nodes.rec_of[n].group == g), t, 0) for g, t in target.items()}
            self.progress.groups(counts)
            failed = set(self.failures()) & mine
            if failed and strict:
                raise OperationFailed(self.shortage())
            pending = mine - running - failed
            if not pending:
                self.joined_in = snodes or None  # every phase recorded came from this look or an earlier one
                return True
            if time.monotonic() > self.deadline:
                if any(self.types[self.nodes.rec_of[n].group] == "Compute" for n in pending):
                    raise WaitTimeout(
                        f"timed out waiting for {len(pending)} node(s) to be idle in Slurm: "
                        f"{', '.join(sorted(pending)[:10])}"
                    )
                raise WaitTimeout(f"login node {min(pending)} cannot reach slurmctld")
            return False

        waits.until(joined, every=NODES_POLL_S, paced=True)

    def _make_controller(self) -> str:
        """Create the controller's container and start it (a retry)."""
        return self._start_controller(self._create_controller())

    def _create_controller(self) -> str:
        """The controller's container (its capacity is taken before any node's)."""
        c, host = self.c, self.c.controller_node
        self.rec.set(c.spec.controller.InstanceGroupName, host, Phase.QUEUED, "waiting for capacity")
        files = {"slurm.conf": (self.conf, 0o644, 0), **controller_files(c)}
        cid = self.launcher.create_many([(c.spec.controller, 1)], files=files)[host]
        if isinstance(cid, LaunchError):
            # no capacity for the controller's type, or its image is missing: fatal, whatever the mode
            raise OperationFailed(f"controller {host} could not be launched: {cid}")
        return cid

    def _start_controller(self, cid: str, fileserver: str | None = None) -> str:
        """Start the controller's container (with registered hosts, /home's file server on
        its host meanwhile; with Accounting its entry waits for slurmdbd)."""
        c, host = self.c, self.c.controller_node
        fs = None
        if fileserver is not None:  # registered hosts: /home's server on the controller's host, meanwhile
            ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-fileserver")
            fs = ex.submit(ensure_fileserver, c, fileserver)
            ex.shutdown(wait=False)
        err = self.launcher.start(cid)
        if fs is not None:
            fs.result()
        if err:
            raise OperationFailed(f"controller {host} could not be started: {err}")
        self.rec.set(c.spec.controller.InstanceGroupName, host, Phase.LAUNCHING, "container started")
        return cid

    def _retry_controller(self, first: LaunchError) -> str:
        """Continuous mode: a controller that failed for a retryable reason (its container
        exited, slurmctld did not answer) is made again, with backoff, a few times."""
        c, host = self.c, self.c.controller_node
        group = c.spec.controller.InstanceGroupName
        failed = f"Controller {host} failed, retrying: {first}"
        self.rec.set(group, host, Phase.LAUNCH_FAILED, str(first)[:300], level="Error", event=failed)
        retryable = retry_if_exception(lambda e: isinstance(e, LaunchError) and e.retryable)
        for attempt in Retrying(
            stop=stop_after_attempt(3), wait=wait_exponential(max=5), reraise=True, retry=retryable
        ):
            with attempt:
                c.p.remove_container(container_name(c.name, host))
                cid = self._make_controller()
                try:
                    wait_controller(c, cid, self.deadline)
                except LaunchError as e:
                    self.rec.set(group, host, Phase.LAUNCH_FAILED, str(e)[:300])
                    raise
                return cid
        raise AssertionError("unreachable")  # pragma: no cover


def _in_service(cluster: Cluster) -> None:
    cluster.store.set_status(cluster.name, ClusterStatus.IN_SERVICE, expect=ClusterStatus.CREATING)


def _slurm_nodes(cluster: Cluster) -> dict[str, SlurmNode]:
    try:
        return {n.name: n for n in cluster.slurm.nodes()}
    except OperationFailed as e:  # one answer lost (a busy host): the next poll asks again
        log.info("waiting for nodes: %s", e)
        return {}


POLL_S = 0.1  # the controller's `scontrol ping`
NODES_POLL_S = 0.1  # a pass of create's wait (one Slurm query, the groups with news synced) starts every 0.1 s, at once after a slower one
SYNC_EVERY = 5  # a compute group with no news is synced every fifth pass


def wait_controller(cluster: Cluster, cid: str, deadline: float) -> None:
    """Ready when `scontrol ping` answers; fails fast (reconciler.not_joined: a retryable
    LaunchError with the last log lines) when its container exits, or when slurmctld does
    not answer within the register timeout (or by `deadline`)."""
    t0 = time.monotonic()
    checks = 0

    def answers() -> bool:
        nonlocal checks
        if cluster.slurm.ping():
            return True
        checks += 1
        waited = time.monotonic() - t0
        if checks % 5 == 0 or time.monotonic() > deadline:
            st = cluster.p.inspect(cid).state
            code = None if st.running else st.exit_code
            what = "slurmctld did not answer 'scontrol ping'"
            if err := not_joined(cluster.p, cid, code, what, waited, cap=deadline - t0, lines=30):
                raise err
        return False

    waits.until(answers, every=POLL_S)
