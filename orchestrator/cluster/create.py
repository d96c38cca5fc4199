"""`hp create`: an ordered list of named stages (as kind's create), with progress
reported per stage and per group, and one rollback path.

Order: network, volumes and key; the controller (ready when `scontrol ping` answers);
then login and compute groups in parallel. Their containers are created while the
controller boots and started the moment it answers.

With registered hosts (core/across_hosts.py): the images are made present on every
host first (one stream from the local engine, fanned out); the network is a swarm
overlay (`--encrypt-network`: proven to carry traffic, else the create fails); each
node is placed on a host (core/placement.py); the /home file server starts on the
controller's host right after the controller.
controller boots and started the moment it answers. With Accounting, the database starts
first and boots while the other containers are created; slurmdbd starts once it is ready,
and slurmctld right after slurmdbd (services/accounting.py); slurmrestd (Rest) starts
with the nodes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from ..core import capacity, placement
from ..core.across_hosts import ensure_fileserver, host_problems, placement_problems, prove_traffic
from ..core.context import Cluster, Env, parallel
from ..core.launcher import Launcher
from ..docker.images import CHECK_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES, NODE_IMAGES, SERVICE_IMAGES
from ..errors import BadInput, HpError, LaunchError, OperationFailed, WaitTimeout
from ..health.requests.gpu_check import thresholds_checked
from ..naming import container_name, database_volume, labels, network_name, node_name, shared_volume, state_volume
from ..services.accounting import CreateServices, controller_files, forget_secrets
from ..slurm.conf import render
from ..spec.model import ClusterSpec, InstanceGroup
from ..state.phases import Phase
from ..state.transitions import ClusterStatus
from .delete import remove_resources

log = logging.getLogger("hp")


class Progress(Protocol):
    def stage(self, name: str, detail: str = "") -> None: ...

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None: ...  # group -> (current, target, failed)


class NoProgress:
    def stage(self, name: str, detail: str = "") -> None:
        pass

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None:
        pass


@dataclass
class CreateOptions:
    wait: bool = True
    timeout: float = 300.0
    retain: bool = False
    register_timeout: float = 60.0
    encrypt_network: bool = False  # registered hosts only: an IPsec-encrypted overlay


@dataclass
class LaunchOutcome:
    started: dict[str, str] = field(default_factory=dict)  # node -> container id
    failed: dict[str, LaunchError] = field(default_factory=dict)


def check_name_free(env: Env, name: str) -> None:
    row = env.store.cluster(name)
    existing = env.provider.containers(name) or env.provider.networks(name) or env.provider.volumes(name)
    if row is not None and not (row.status == ClusterStatus.FAILED and not existing):
        raise BadInput(
            f"a cluster named {name!r} already exists ({row.status}); "
            f"delete it first with 'hp delete {name}' or pick another --name",
            "name in use",
        )
    if row is None and existing:
        raise BadInput(
            f"Docker already holds resources labelled for cluster {name!r} "
            f"(left over from an earlier run?); remove them with 'hp delete {name}'",
            "name in use",
        )
    if row is not None:
        env.store.remove_cluster(name)  # a Failed cluster with nothing left: its name is free again


def has_gpus(spec: ClusterSpec, catalogue: dict) -> bool:
    return any(catalogue[g.InstanceType].gpus for g in spec.InstanceGroups if g.InstanceType in catalogue)


def image_defs(spec: ClusterSpec, catalogue: dict | None = None, multihost: bool = False) -> tuple:
    """The node images; the check images when a group checks new nodes on start; the
    GPU check image (checks and the passive GPU monitor) when a group has GPUs; the service
    images (Accounting, Rest); with registered hosts, the /home-mounting node image and
    the file server."""
    services = {"accounting": spec.accounting, "database": spec.accounting, "rest": spec.rest}
    defs = NODE_IMAGES + tuple(d for d in SERVICE_IMAGES if services[d.name])
    defs += MULTIHOST_IMAGES if multihost else ()
    defs += CHECK_IMAGES if any(g.OnStartDeepHealthChecks for g in spec.InstanceGroups) else ()
    return defs + (GPU_IMAGES if catalogue is not None and has_gpus(spec, catalogue) else ())


def capacity_problems(
    env: Env | None, spec: ClusterSpec, pool: capacity.Pool | None = None, catalogue: dict | None = None
) -> list[str]:
    """Instance types the spec asks more of than the hosts could ever run (each host's
    whole pool, every other node gone; a node fits on one host, and a type's pool is
    the sum over the hosts its groups may use): refused before anything is made."""
    assert env is not None or pool is not None
    per_host = {"": pool} if pool is not None else capacity.pools(env.provider, env.store)[0]  # type: ignore[union-attr]
    catalogue = catalogue or env.catalogue  # type: ignore[union-attr]
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
        if list(bounds) == [""]:
            problems.append(
                f"InsufficientCapacity: {n} node(s) of {t} are more than this host can ever run: {most} ({bounds[''][1]})"
            )
        else:
            per = ", ".join(f"{h}: {b[0]} ({b[1]})" for h, b in bounds.items()) or "no host available"
            problems.append(
                f"InsufficientCapacity: {n} node(s) of {t} are more than the hosts can ever run: {most} ({per})"
            )
    return problems


def create(env: Env, spec: ClusterSpec, opts: CreateOptions, progress: Progress = NoProgress()) -> Cluster:
    name = spec.ClusterName
    env.provider.ping()
    check_name_free(env, name)
    # fixed from now on (slurm.conf): the node slots, and whether the services run
    spec = spec.model_copy(update={"MaxNodeCount": spec.max_nodes}).with_services_fixed()
    problems = placement_problems(env, spec)
    if opts.encrypt_network and not env.multihost:
        problems.append("--encrypt-network: a cluster on one engine has no traffic between hosts (hp hosts add)")
    if problems := problems or capacity_problems(env, spec):
        raise BadInput(problems, "cannot create")
    if has_gpus(spec, env.catalogue):
        thresholds_checked()  # a bad thresholds file is bad input: refused before anything is made
    if env.multihost:  # a host that cannot run the nodes is refused before any image is built
        progress.stage("hosts", "probing what nodes need on every host")
        if problems := host_problems(env, lambda s: progress.stage("hosts", s)):
            raise BadInput(problems, "cannot create")
    progress.stage("images", "checking node images")
    images = env.images.build(image_defs(spec, env.catalogue, env.multihost), log=lambda s: progress.stage("images", s))
    # NodePackages: the login and compute images derived from hp's (the Launcher runs them)
    derived = env.images.build_packages(images, spec.packages, log=lambda s: progress.stage("images", s))
    if env.multihost:
        progress.stage("images", "on every host")
        # with the base image's tag (its layers travel anyway): GPU discovery probes in it
        refs = sorted(set(images.values()) | set(derived.values()) | {env.images.base(make=False)[0]})
        env.provider.prepare_images(refs, lambda s: progress.stage("images", s))
    mode = "continuous" if spec.continuous else "all-or-nothing"
    if not env.store.add_cluster(
        name, spec.model_dump(exclude_none=True), ClusterStatus.CREATING, f"{mode} provisioning"
    ):
        raise BadInput(f"a cluster named {name!r} already exists", "name in use")
    cluster = Cluster(env, name, spec)
    with env.agents.creation_lock(name):  # no agent may act on the cluster while it is being made
        _create_and_record(cluster, images, opts, progress)
    env.agents.ensure(name)  # provisioning retries and node recovery go on in the background
    return cluster


def _create_and_record(cluster: Cluster, images: dict[str, str], opts: CreateOptions, progress: Progress) -> None:
    services = CreateServices(cluster, images)
    try:
        _create(cluster, images, opts, progress, services)
    except BaseException as e:  # every failure (^C too) ends in the one rollback path, then goes on up
        services.settle()  # nothing may still be making a container while everything is removed
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


def _create(
    cluster: Cluster,
    images: dict[str, str],
    opts: CreateOptions,
    progress: Progress,
    services: CreateServices | None = None,
) -> None:
    env, spec, name, p = cluster.env, cluster.spec, cluster.name, cluster.p
    deadline = time.monotonic() + opts.timeout
    progress.stage("network", "network, volumes and auth key")
    p.create_network(network_name(name), labels(name, "network"), encrypted=opts.encrypt_network)
    if cluster.multihost:  # volumes are made on the host of the container that mounts them
        if opts.encrypt_network:
            progress.stage("network", "proving the encrypted overlay carries traffic between hosts")
            progress.stage("network", prove_traffic(cluster, images["worker"]))
    else:
        p.create_volume(state_volume(name), labels(name, "state"))
        p.create_volume(shared_volume(name), labels(name, "shared"))
        if spec.accounting:
            p.create_volume(database_volume(name), labels(name, "database"))
    cluster.make_key()
    launcher = Launcher(cluster, images)

    conf = render(spec, env.catalogue).encode()
    services = services or CreateServices(cluster, images)
    if spec.accounting:
        progress.stage("accounting", "database, then slurmdbd, before slurmctld")
    services.begin(conf)  # the database boots while the other containers are created
    progress.stage("controller", cluster.controller_host)
    ctl_res = _start_controller(cluster, launcher, conf, images.get("fileserver"), start=not spec.accounting)

    # While slurmctld boots (with Accounting: while the database boots), create every other node's container.
    wanted = [(g, i) for g in spec.InstanceGroups if g.node_type != "Controller" for i in range(1, g.InstanceCount + 1)]
    groups = {node_name(g.InstanceGroupName, i): g for g, i in wanted}
    for n in groups:
        env.store.set_phase(name, n, Phase.QUEUED, "waiting for capacity")
    created = launcher.create_many(wanted)
    # registered hosts: nodes start at once (their entry mounts /home and waits for
    # slurmctld), so that their overlay attachment overlaps the controller's boot; nodes
    # with a lifecycle script too (their entry runs it, then waits for slurmctld)
    early = _start_early(launcher, created, every=cluster.multihost)
    if spec.accounting:  # slurmctld registers the cluster with slurmdbd at its first start
        services.accounting_up(deadline)
        if err := launcher.start(ctl_res):
            raise OperationFailed(f"controller {cluster.controller_host} could not be started: {err}")
        services.accounting_ready()
    try:
        wait_controller(cluster, ctl_res, min(deadline, time.monotonic() + 60))
    except LaunchError as e:
        if not (spec.continuous and e.retryable):
            if early is not None:
                early.result()
            raise OperationFailed(f"controller {cluster.controller_host}: {e}") from None
        ctl_res = _retry_controller(cluster, launcher, conf, deadline, e)
    env.store.set_phase(name, cluster.controller_host, Phase.RUNNING)
    env.store.event(
        name,
        "Instance",
        "Info",
        f"Controller {cluster.controller_host} is up",
        spec.controller.InstanceGroupName,
        node=cluster.controller_host,
    )

    progress.stage("nodes", "starting login and compute nodes")
    services.start_rest()
    outcome = LaunchOutcome()
    started_early = early.result() if early is not None else {}
    ids = [(n, r) for n, r in created.items() if isinstance(r, str) and n not in started_early]
    results = dict(zip([n for n, _ in ids], parallel(lambda t: launcher.start(t[1]), ids), strict=True))
    results.update(started_early)
    for n, cid in ((n, r) for n, r in created.items() if isinstance(r, str)):
        err = results[n]
        if err:
            outcome.failed[n] = err
        else:
            outcome.started[n] = cid
    outcome.failed.update({n: r for n, r in created.items() if isinstance(r, LaunchError)})
    for n in outcome.started:
        env.store.set_phase(name, n, Phase.LAUNCHING, "container started")
    for n, err in outcome.failed.items():
        g = groups[n]
        env.store.set_phase(name, n, Phase.LAUNCH_FAILED, f"{err} (retry 1)")
        env.store.event(
            name,
            "Instance",
            "Warn" if err.code == "InsufficientCapacity" else "Error",
            f"Instance creation in cluster {name} and instance group {g.InstanceGroupName} failed: {err}",
            g.InstanceGroupName,
            node=n,
        )
    if outcome.failed and not spec.continuous:
        raise OperationFailed(_shortage_message(outcome.failed, groups))
    logins = [n for n in outcome.started if groups[n].node_type == "Login"]
    workers = [n for n in outcome.started if groups[n].node_type == "Compute"]
    if spec.continuous:
        # InService once the controller and the login nodes are up; the agent brings
        # the workers in as they come, and retries what failed.
        if opts.wait:
            progress.stage("wait", "waiting for the login node(s)")
            wait_nodes(cluster, [], logins, deadline, opts.register_timeout, progress, strict=True)
            for n in logins:
                env.store.set_phase(name, n, Phase.RUNNING)
        _in_service(cluster)
        return
    if not opts.wait:
        return  # the agent marks it InService once every node joined
    progress.stage("wait", "waiting for nodes to be idle in Slurm")
    wait_nodes(cluster, workers, logins, deadline, opts.register_timeout, progress, strict=True)
    for n in outcome.started:
        if not groups[n].OnStartDeepHealthChecks:  # those are marked Running by the agent, which checks them
            env.store.set_phase(name, n, Phase.RUNNING)
    _in_service(cluster)


def _start_early(
    launcher: Launcher, created: dict[str, str | LaunchError], every: bool
) -> Future[dict[str, LaunchError | None]] | None:
    """Start the created non-GPU nodes (`every`), or those with a lifecycle script, on a
    thread (GPU nodes wait for gres.conf, which needs slurmctld); node -> the LaunchError
    that stopped it, or None. None when there is none to start."""
    todo = [
        (n, r)
        for n, r in created.items()
        if isinstance(r, str) and r not in launcher.gpu_cids and (every or launcher.has_oncreate(r))
    ]
    if not todo:
        return None

    def run() -> dict[str, LaunchError | None]:
        return dict(zip([n for n, _ in todo], parallel(lambda t: launcher.start(t[1]), todo), strict=True))

    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-early-start")
    try:
        return ex.submit(run)
    finally:
        ex.shutdown(wait=False)


def _in_service(cluster: Cluster) -> None:
    cluster.store.set_status(cluster.name, ClusterStatus.IN_SERVICE, expect=ClusterStatus.CREATING)


def _start_controller(
    cluster: Cluster, launcher: Launcher, conf: bytes, fileserver: str | None = None, start: bool = True
) -> str:
    """Create the controller's container (with registered hosts, /home's file server on its
    host meanwhile), and start it unless not `start` (with Accounting: started by the
    caller once the database is ready and slurmdbd started)."""
    host = cluster.controller_host
    cluster.store.set_phase(cluster.name, host, Phase.QUEUED, "waiting for capacity")
    files = {"slurm.conf": (conf, 0o644, 0), **controller_files(cluster)}
    res = launcher.create_many([(cluster.spec.controller, 1)], files=files)
    cid = res[host]
    if isinstance(cid, LaunchError):
        # no capacity for the controller's type, or its image is missing: fatal, whatever the mode
        raise OperationFailed(f"controller {host} could not be launched: {cid}")
    fs = None
    if fileserver is not None:  # registered hosts: /home's server on the controller's host, meanwhile
        ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-fileserver")
        fs = ex.submit(ensure_fileserver, cluster, fileserver)
        ex.shutdown(wait=False)
    if not start:
        if fs is not None:
            fs.result()
        cluster.store.set_phase(cluster.name, host, Phase.LAUNCHING, "container created")
        return cid
    err = launcher.start(cid)
    if fs is not None:
        fs.result()
    if err:
        raise OperationFailed(f"controller {host} could not be started: {err}")
    cluster.store.set_phase(cluster.name, host, Phase.LAUNCHING, "container started")
    return cid


def _retry_controller(cluster: Cluster, launcher: Launcher, conf: bytes, deadline: float, first: LaunchError) -> str:
    """Continuous mode: a controller that failed for a retryable reason (its container
    exited, slurmctld did not answer) is made again, with backoff, a few times."""
    env, name, host = cluster.env, cluster.name, cluster.controller_host
    group = cluster.spec.controller.InstanceGroupName
    env.store.event(name, "Instance", "Error", f"Controller {host} failed, retrying: {first}", group, node=host)
    env.store.set_phase(name, host, Phase.LAUNCH_FAILED, str(first)[:300])
    retryable = retry_if_exception(lambda e: isinstance(e, LaunchError) and e.retryable)
    for attempt in Retrying(stop=stop_after_attempt(3), wait=wait_exponential(max=5), reraise=True, retry=retryable):
        with attempt:
            cluster.p.remove_container(container_name(name, host))
            cid = _start_controller(cluster, launcher, conf)
            try:
                wait_controller(cluster, cid, min(deadline, time.monotonic() + 60))
            except LaunchError as e:
                env.store.set_phase(name, host, Phase.LAUNCH_FAILED, str(e)[:300])
                raise
            return cid
    raise AssertionError("unreachable")  # pragma: no cover


def _shortage_message(failed: dict[str, LaunchError], groups: dict[str, InstanceGroup]) -> str:
    by_group: dict[str, list[str]] = {}
    for n, e in failed.items():
        by_group.setdefault(groups[n].InstanceGroupName, []).append(f"{n}: {e}")
    parts = [
        f"group {g} could not be fully provisioned ({len(v)} node(s)): " + "; ".join(v[:3]) for g, v in by_group.items()
    ]
    return "all-or-nothing provisioning failed: " + " | ".join(parts)


POLL_S = 0.1


def wait_controller(cluster: Cluster, cid: str, deadline: float) -> None:
    """Ready when `scontrol ping` answers; fail fast if the container exits (a
    retryable LaunchError carrying the last log lines)."""
    checks = 0
    while True:
        if cluster.slurm.ping():
            return
        checks += 1
        if checks % 5 == 0:
            st = cluster.p.inspect(cid).state
            if not st.running:
                logs = cluster.p.logs(cid, tail=30)
                raise LaunchError(
                    "ContainerExited",
                    f"controller exited ({st.exit_code}) before answering; last log:\n{logs}",
                    retryable=True,
                )
        if time.monotonic() > deadline:
            raise LaunchError(
                "RegistrationTimeout",
                "controller did not answer 'scontrol ping' in time; last log:\n" + cluster.p.logs(cid, tail=30),
                retryable=True,
            )
        time.sleep(POLL_S)


def wait_nodes(
    cluster: Cluster,
    workers: list[str],
    logins: list[str],
    deadline: float,
    register_timeout: float,
    progress: Progress,
    strict: bool,
) -> dict[str, LaunchError]:
    """Wait until every worker is idle in Slurm and login nodes answer. A node whose
    container exits, or that does not register in `register_timeout`, fails: at once
    when `strict` (all-or-nothing), else it is reported and left to the agent."""
    spec, name = cluster.spec, cluster.name
    failed: dict[str, LaunchError] = {}
    t0 = time.monotonic()
    want = set(workers)
    polls = 0
    target = {g.InstanceGroupName: g.InstanceCount for g in spec.compute}
    gname = {g.InstanceGroupName.lower(): g.InstanceGroupName for g in spec.InstanceGroups}
    group_of = {n: gname[n.rsplit("-", 1)[0]] for n in workers}
    while True:
        # a node of a group with on-start checks registers drained: it is up, and is
        # checked by the agent before it takes jobs
        try:
            snodes = cluster.slurm.nodes()
        except OperationFailed as e:  # one answer lost (a busy host): the next poll asks again
            log.info("waiting for nodes: %s", e)
            snodes = []
        idle = {n.name for n in snodes if n.usable or (n.awaiting_onstart and not n.not_responding)} & want
        counts = {g: (sum(1 for n in idle if group_of[n] == g), t, 0) for g, t in target.items()}
        progress.groups(counts)
        pending = want - idle - set(failed)
        if not pending:
            break
        polls += 1
        if polls % 5 == 0:  # look at the containers of nodes still missing
            states = cluster.node_containers()
            for n in list(pending):
                c = states.get(n)
                if c is None or c.dead:
                    logs = cluster.p.logs(c.id, tail=5).strip() if c else ""
                    failed[n] = LaunchError(
                        "ContainerExited",
                        f"{n} exited with code {c.exit_code if c else None} at start: {logs[-300:]}",
                        retryable=True,
                    )
                elif time.monotonic() - t0 > register_timeout:
                    failed[n] = LaunchError(
                        "RegistrationTimeout",
                        f"slurmd on {n} did not register within {register_timeout:g} s",
                        retryable=True,
                    )
            if failed and strict:
                raise OperationFailed(_shortage_message(failed, {n: spec.group(group_of[n]) for n in failed}))
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"timed out waiting for {len(pending)} node(s) to be idle in Slurm: {', '.join(sorted(pending)[:10])}"
            )
        time.sleep(0.2)
    for n in logins:
        while not cluster.slurm.ping_from(container_name(name, n)):
            if time.monotonic() > deadline:
                raise WaitTimeout(f"login node {n} cannot reach slurmctld")
            time.sleep(0.2)
    return failed
