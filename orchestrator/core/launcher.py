"""Creating and starting node containers. Every failure is classified (LaunchError)
where it is observed: capacity and transient engine faults are retryable, a missing
image is not. Only the engine's errors are classified; anything else is a bug and goes
up to the caller's failure policy.

GPU nodes: capacity picks the node's GPUs (one model), the host's discovery
(gpu/inventory.py) says how to give them (wiring: NVIDIA runtime, CDI or device nodes plus
the driver's files), the node registers with `Gres=gpu:<model>:N`, and the
controller's gres.conf gets its lines, with `scontrol reconfigure`, before its slurmd
starts (gpu/gresconf.py).

Lifecycle scripts (LifeCycleConfig): the group's folder and the node's facts go into
the container with its other files; start() then waits for the script, which the
node's entry runs before its Slurm daemon (core/lifecycle.py), and a failure is the
node's LaunchError. The launch path (cluster/reconciler.py: the agent's and hp create's) and
replace start nodes here, so the script runs on every new node the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..docker.views import LOCAL_ENGINE, ContainerSpec
from ..errors import EngineError, EngineUnavailable, InsufficientCapacity, LaunchError, OperationFailed
from ..gpu import gresconf
from ..gpu.gres import GresError, slurmd_conf_gres
from ..gpu.wiring import GpuWiring, GpuWiringError
from ..naming import (
    L_GPU_DEVICES,
    L_GPU_MODE,
    L_GPU_MODEL,
    L_GPUS,
    ROLE_BY_NODE_TYPE,
    container_name,
    database_volume,
    labels,
    network_name,
    node_name,
    shared_volume,
    state_volume,
)
from ..slurm.conf import slurmd_conf
from ..slurm.model import ONSTART_REASON
from . import capacity, lifecycle, placement
from .context import SLURM_UID, Cluster, parallel

if TYPE_CHECKING:
    from ..spec.model import InstanceGroup

log = logging.getLogger("hp")
FileMap = dict[str, tuple[bytes, int, int]]
# (cores, MiB) that Accounting's slurmdbd and MariaDB add to the controller's quota, in its
# container: MariaDB needs about a core's quota to boot fast (0.5: +0.7 s, before the
# seed data directory); 1.0 + 0.5 were their containers' quotas when each had one. Not
# counted in the host's capacity (a quota is a ceiling; they idle after create).
ACCOUNTING_QUOTA = (1.5, 512)


def classify(e: EngineError, what: str) -> LaunchError:
    """An engine error while launching, as a LaunchError that says whether to retry."""
    if e.missing:
        return LaunchError("ImageNotFound", f"{what}: {e}; build the images with 'hp images build'", retryable=False)
    if e.conflict:
        return LaunchError("ContainerExists", f"{what}: {e}", retryable=True)
    return LaunchError("ContainerCreateFailed", f"{what}: {str(e)[:300]}", retryable=True)


class Launcher:
    def __init__(self, cluster: Cluster, images: dict[str, str]):
        self.c = cluster
        # hp's images; with NodePackages, login and compute nodes run the derived ones
        self.images = cluster.images.with_packages(images, cluster.spec.packages)
        self._gpu_cids: set[str] = set()  # created GPU nodes: started only once gres.conf is in force
        self._oncreate: dict[str, tuple[InstanceGroup, str]] = {}  # created nodes with a lifecycle script

    @property
    def gpu_cids(self) -> set[str]:
        """GPU nodes created by this launcher (started only once gres.conf is in force)."""
        return set(self._gpu_cids)

    @property
    def gres_pending(self) -> bool:
        """gres.conf was written and slurmctld not reconfigured since (kept in the store:
        an agent that restarts in between still reconfigures before a GPU node starts)."""
        return self.c.store.get(f"gres.pending:{self.c.name}") == "1"

    @gres_pending.setter
    def gres_pending(self, value: bool) -> None:
        self.c.store.put(f"gres.pending:{self.c.name}", "1" if value else None)

    def gpu_setup(
        self, gpus: list[str], host: str = LOCAL_ENGINE
    ) -> tuple[GpuWiring | None, dict[str, str], str | None]:
        """(wiring, labels, Gres= word) of a node given these GPUs of the host.
        Raises GpuWiringError / GresError when they cannot be given."""
        info = self.c.env.gpus(host=host)
        wiring = info.wiring(gpus)
        models = info.model_of()
        model = models.get(gpus[0], "")
        lab = {L_GPUS: ",".join(gpus), L_GPU_MODE: wiring.mode if wiring else "none"}
        if wiring is None:  # HP_GPUS stand-ins: capacity only
            return None, lab, None
        lab[L_GPU_MODEL] = model
        lab[L_GPU_DEVICES] = ",".join(wiring.device_files)
        return wiring, lab, slurmd_conf_gres(model, len(gpus))

    def container_spec(
        self,
        group: InstanceGroup,
        index: int,
        gpus: list[str] | None = None,
        drain_reason: str | None = None,
        host: str = LOCAL_ENGINE,
    ) -> ContainerSpec:
        c = self.c
        role = ROLE_BY_NODE_TYPE[group.node_type]
        itype = c.env.catalogue[group.InstanceType]
        node = node_name(group.InstanceGroupName, index)
        # HP_ROLE set here too: a user's image FROM hp's worker image serves a login group as well
        env = {"HP_CONTROLLER": c.controller_node, "HP_CLUSTER": c.name, "HP_ROLE": role}
        # hpuser's uid and gid on every node (hp-entry writes them before any daemon starts)
        env["HP_USER_UID"], env["HP_USER_GID"] = (str(i) for i in c.store.user_ids(c.name))
        vols = {shared_volume(c.name): "/home"}
        binds = [f"{m.Source}:{m.target}:{'ro' if m.ReadOnly else 'rw'}" for m in c.spec.Mounts or ()]
        wiring, gpu_labels, gres = self.gpu_setup(gpus, host) if gpus else (None, {}, None)
        if role == "worker":
            # with on-start checks the node registers drained, so it takes no job before they pass
            reason = drain_reason or (ONSTART_REASON if group.OnStartDeepHealthChecks else None)
            env["HP_SLURMD_CONF"] = slurmd_conf(itype, group.InstanceGroupName.lower(), reason, gres)
        cpus, mib = itype.cpu_limit, itype.memory_mib
        if role == "controller":
            vols, binds = {state_volume(c.name): "/var/spool/slurmctld"}, []
            if c.spec.accounting:  # slurmdbd and MariaDB run beside slurmctld, their data on a volume
                vols[database_volume(c.name)] = "/var/lib/mysql"
                cpus, mib = cpus + ACCOUNTING_QUOTA[0], mib + ACCOUNTING_QUOTA[1]
        lab = labels(c.name, role, group.InstanceGroupName, node, index, itype.name)
        lab.update(gpu_labels)
        spec = ContainerSpec(
            name=container_name(c.name, node),
            image=group.Image or self.images[c.p.node_image(role)],
            hostname=node,
            labels=lab,
            network=network_name(c.name),
            environment=env,
            volumes=vols,
            binds=binds,
            cpu_limit=cpus,
            memory_bytes=mib * 2**20,
            gpus=wiring,
        )
        c.p.place(spec, c.name, role, host)  # across hosts: on its host, /home from the file server
        return spec

    def create_many(
        self,
        wanted: list[tuple[InstanceGroup, int]],
        files: FileMap | None = None,
        drain_reason: str | None = None,
        on_made: Callable[[str, str], None] | None = None,
    ) -> dict[str, str | LaunchError]:
        """Reserve capacity for the wanted nodes and create (not start) their containers,
        in parallel. Returns node name -> container id, or the LaunchError that stopped it.
        Capacity is decided for the whole batch under one host-wide lock: created
        containers count as used, so the next decision (any process) sees them.
        `on_made(node, cid)` is called as each node without GPUs is made (its files in),
        so that its start need not wait for the batch's last create; a GPU node's start
        waits for gres.conf, written once the batch is made."""
        c = self.c
        out: dict[str, str | LaunchError] = {}
        todo: list[tuple[InstanceGroup, int, list[str] | None, str]] = []
        with capacity.host_lock(c.store.home):
            gpus = capacity.wants_gpus(c.env.catalogue, (g.InstanceType for g, _ in wanted))
            pools, unavailable = capacity.pools(c.p, c.store, gpus)
            containers = c.p.containers()
            load = placement.loads(pools, containers, c.env.catalogue, c.name)
            per_type = capacity.usage(containers, c.env.catalogue).per_type
            lim = capacity.limits(c.store)
            registered = list(c.p.engines())
            for g, i in wanted:
                itype = c.env.catalogue[g.InstanceType]
                try:
                    if short := capacity.limit_problems(itype, per_type, lim):
                        raise InsufficientCapacity(f"no capacity for instance type {itype.name}: " + "; ".join(short))
                    host, gpus = placement.place(itype, g, registered, load, unavailable)
                except LaunchError as e:
                    out[node_name(g.InstanceGroupName, i)] = e
                    continue
                load[host] = load[host].plus(itype, gpus or [], g.InstanceGroupName)
                per_type = {**per_type, itype.name: per_type.get(itype.name, 0) + 1}
                todo.append((g, i, gpus, host))
            if c.p.places_nodes:  # recorded first: a copy of the node on another host is stale from now on
                for g, i, _, host in todo:
                    c.store.set_node_host(c.name, node_name(g.InstanceGroupName, i), host)

            def one(t: tuple[InstanceGroup, int, list[str] | None, str]) -> str | LaunchError:
                res = self._create_one(t[0], t[1], t[2], files, drain_reason, t[3])
                if on_made is not None and isinstance(res, str) and not t[2]:
                    on_made(node_name(t[0].InstanceGroupName, t[1]), res)
                return res

            results = parallel(one, todo)
        for (g, i, _, _), r in zip(todo, results, strict=True):
            out[node_name(g.InstanceGroupName, i)] = r
        gpu_nodes = {
            node_name(g.InstanceGroupName, i): out[node_name(g.InstanceGroupName, i)]
            for g, i, gpus, _ in todo
            if gpus and isinstance(out[node_name(g.InstanceGroupName, i)], str)
        }
        if gpu_nodes:
            self._gres(gpu_nodes, out)
        return out

    def _gres(self, gpu_nodes: dict[str, str | LaunchError], out: dict[str, str | LaunchError]) -> None:
        """Put the new GPU nodes' lines in the controller's gres.conf and reconfigure
        slurmctld, before they start. A controller that does not answer yet (at create)
        is reconfigured by start(), once it does."""
        c = self.c
        cids = {n: cid for n, cid in gpu_nodes.items() if isinstance(cid, str)}
        try:
            written = gresconf.write_gres_conf(c, list(cids))
        except (EngineError, GresError) as e:
            for n, cid in cids.items():
                c.p.remove_container(cid)
                out[n] = LaunchError("GresConfigFailed", f"gres.conf of the controller: {str(e)[:300]}", retryable=True)
            return
        self._gpu_cids |= set(cids.values())
        if written:
            self.gres_pending = True
            if c.slurm.ping():  # at create slurmctld is still starting: start() reconfigures
                self._reconfigure()

    def _reconfigure(self) -> str | None:
        """Reconfigure slurmctld if gres.conf changed; why not, when it could not be."""
        if not self.gres_pending:
            return None
        try:
            self.c.slurm.reconfigure()
        except OperationFailed as e:
            log.info("reconfiguring slurmctld failed: %s (tried again before GPU nodes start)", e)
            return str(e)
        self.gres_pending = False
        return None

    def _create_one(
        self,
        group: InstanceGroup,
        index: int,
        gpus: list[str] | None,
        files: FileMap | None,
        drain_reason: str | None,
        host: str = LOCAL_ENGINE,
    ) -> str | LaunchError:
        c = self.c
        try:
            spec = self.container_spec(group, index, gpus, drain_reason, host)
        except (GpuWiringError, GresError) as e:
            return LaunchError("GpuWiringFailed", str(e)[:300], retryable=True)
        try:
            cid = c.p.create_container(spec)
        except EngineError as e:
            return classify(e, spec.name)
        except EngineUnavailable as e:  # the host chosen went away: another is chosen next time
            return LaunchError("HostUnavailable", f"{spec.name}: {str(e)[:300]}", retryable=True)
        try:
            put = {"slurm.key": (c.key(), 0o600, SLURM_UID if group.node_type == "Controller" else 0)}
            put.update(files or {})
            # one copy into the container (each is a mount of its file system by the engine)
            put = {f"etc/slurm/{name}": f for name, f in put.items()}
            if group.LifeCycleConfig is not None:
                put.update(lifecycle.files(c.spec, group, index, c.controller_node))
                self._oncreate[cid] = (group, spec.hostname)
            c.p.put_files(cid, "/", put)
        except EngineError as e:
            c.p.remove_container(cid)
            return classify(e, spec.name)
        except LaunchError as e:  # the group's folder cannot be read any more
            c.p.remove_container(cid)
            return e
        return cid

    def _is_gpu_node(self, cid: str) -> bool:
        if cid in self._gpu_cids:
            return True
        try:  # e.g. a container left created by a crash, started by another Launcher
            return bool(self.c.p.inspect(cid).labels.get(L_GPU_DEVICES))
        except EngineError:
            return False

    def start(self, cid: str) -> LaunchError | None:
        if self.gres_pending and self._is_gpu_node(cid) and (why := self._reconfigure()):
            # its slurmd would register without the gres.conf lines that name its GPUs
            return LaunchError(
                "GresConfigFailed", f"slurmctld not reconfigured for gres.conf: {why[:200]}", retryable=True
            )
        try:
            self.c.p.start(cid)
        except EngineError as e:  # e.g. a port or device conflict: retry later
            return LaunchError("ContainerStartFailed", str(e)[:300], retryable=True)
        if cid in self._oncreate:
            return self._await_oncreate(cid)
        return None

    def _await_oncreate(self, cid: str) -> LaunchError | None:
        """Wait for the node's lifecycle script; its exit code and last lines in an event.
        A failed node's container is removed (the failure is the launch's)."""
        c = self.c
        group, node = self._oncreate.pop(cid)
        lc = group.LifeCycleConfig
        assert lc is not None
        t0 = time.monotonic()
        rc, tail, err, seconds = lifecycle.wait_result(c.p, cid, lc)
        took = seconds if seconds is not None else time.monotonic() - t0  # the node's figure when it said one
        last = " | ".join(tail) if tail else "(no output)"
        c.store.event(
            c.name,
            "Instance",
            "Error" if err else "Info",
            f"Lifecycle script {lc.OnCreate} on {node} exited {rc} after {took:.2f} s; last lines: {last[:600]}",
            group.InstanceGroupName,
            node=node,
        )
        if err is not None:
            c.p.remove_container(cid)
        return err
