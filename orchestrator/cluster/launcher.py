"""Creating and starting node containers. Every failure is classified (LaunchError)
where it is observed: capacity and transient engine faults are retryable, a missing
image is not. Only the engine's errors are classified; anything else is a bug and goes
up to the caller's failure policy."""

from __future__ import annotations

from ..docker.views import ContainerSpec
from ..errors import EngineError, LaunchError
from ..naming import (
    L_GPUS,
    ROLE_BY_NODE_TYPE,
    container_name,
    labels,
    network_name,
    node_name,
    shared_volume,
    state_volume,
)
from ..slurm.conf import slurmd_conf
from ..slurm.model import ONSTART_REASON
from ..spec.model import InstanceGroup
from . import capacity
from .context import SLURM_UID, Cluster, parallel

FileMap = dict[str, tuple[bytes, int, int]]


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
        self.images = images

    def container_spec(
        self, group: InstanceGroup, index: int, gpus: list[str] | None = None, drain_reason: str | None = None
    ) -> ContainerSpec:
        c = self.c
        role = ROLE_BY_NODE_TYPE[group.node_type]
        itype = c.env.catalogue[group.InstanceType]
        node = node_name(group.InstanceGroupName, index)
        env = {"HP_CONTROLLER": c.controller_host, "HP_CLUSTER": c.name}
        vols = {shared_volume(c.name): "/home"}
        if role == "worker":
            # with on-start checks the node registers drained, so it takes no job before they pass
            reason = drain_reason or (ONSTART_REASON if group.OnStartDeepHealthChecks else None)
            env["HP_SLURMD_CONF"] = slurmd_conf(itype, group.InstanceGroupName.lower(), reason)
        if role == "controller":
            vols = {state_volume(c.name): "/var/spool/slurmctld"}
        lab = labels(c.name, role, group.InstanceGroupName, node, index, itype.name)
        if gpus:
            lab[L_GPUS] = ",".join(gpus)
        return ContainerSpec(
            name=container_name(c.name, node),
            image=group.Image or self.images[role],
            hostname=node,
            labels=lab,
            network=network_name(c.name),
            environment=env,
            volumes=vols,
            cpu_limit=itype.cpu_limit,
            memory_bytes=itype.memory_mib * 2**20,
        )

    def create_many(
        self,
        wanted: list[tuple[InstanceGroup, int]],
        files: FileMap | None = None,
        drain_reason: str | None = None,
    ) -> dict[str, str | LaunchError]:
        """Reserve capacity for the wanted nodes and create (not start) their containers,
        in parallel. Returns node name -> container id, or the LaunchError that stopped it.
        Capacity is decided for the whole batch under one host-wide lock: created
        containers count as used, so the next decision (any process) sees them."""
        c = self.c
        out: dict[str, str | LaunchError] = {}
        todo: list[tuple[InstanceGroup, int, list[str] | None]] = []
        with capacity.host_lock(c.store.home):
            pool = capacity.host_pool(c.p)
            used = capacity.usage(c.p.containers(), c.env.catalogue)
            lim = capacity.limits(c.store)
            for g, i in wanted:
                itype = c.env.catalogue[g.InstanceType]
                try:
                    gpus = capacity.check(itype, pool, used, lim)
                except LaunchError as e:
                    out[node_name(g.InstanceGroupName, i)] = e
                    continue
                used = used.plus(itype, gpus or [])
                todo.append((g, i, gpus))
            results = parallel(lambda t: self._create_one(t[0], t[1], t[2], files, drain_reason), todo)
        for (g, i, _), r in zip(todo, results, strict=True):
            out[node_name(g.InstanceGroupName, i)] = r
        return out

    def _create_one(
        self,
        group: InstanceGroup,
        index: int,
        gpus: list[str] | None,
        files: FileMap | None,
        drain_reason: str | None,
    ) -> str | LaunchError:
        c = self.c
        spec = self.container_spec(group, index, gpus, drain_reason)
        try:
            cid = c.p.create_container(spec)
        except EngineError as e:
            return classify(e, spec.name)
        try:
            put = {"slurm.key": (c.key(), 0o600, SLURM_UID if group.node_type == "Controller" else 0)}
            put.update(files or {})
            c.p.put_files(cid, "/etc/slurm", put)
        except EngineError as e:
            c.p.remove_container(cid)
            return classify(e, spec.name)
        return cid

    def start(self, cid: str) -> LaunchError | None:
        try:
            self.c.p.start(cid)
            return None
        except EngineError as e:  # e.g. a port or device conflict: retry later
            return LaunchError("ContainerStartFailed", str(e)[:300], retryable=True)
