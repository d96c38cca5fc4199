"""A cluster's context (what every operation needs) and the node launcher."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from . import capacity
from .catalogue import InstanceType, load_catalogue
from .errors import BadInput, LaunchError, NotFound
from .images import Images
from .naming import (L_GROUP, L_INDEX, L_NODE, L_ROLE, ROLE_BY_NODE_TYPE, container_name, labels,
                     network_name, node_name, shared_volume, state_volume)
from .provider import ContainerInfo, ContainerSpec, DockerProvider
from .slurm import Slurm
from .slurmconf import controller_host
from .spec import ClusterSpec, InstanceGroup, validate
from .state import Store

T = TypeVar("T")
R = TypeVar("R")
SLURM_UID = 64030  # Debian's fixed uid for the slurm user
DEFAULT_USER = "hpuser"
ONSTART_REASON = "hp-health:on-start:pending"
NODE_ROLES = ("controller", "login", "worker")  # not "check": health-check containers carry a node's labels too


@dataclass
class Env:
    """Process-wide handles, made once per command and passed down (no globals)."""

    provider: DockerProvider = field(default_factory=DockerProvider)
    store: Store = field(default_factory=Store)

    @cached_property
    def catalogue(self) -> dict[str, InstanceType]:
        return load_catalogue()

    @cached_property
    def images(self) -> Images:
        return Images(self.provider)


class Cluster:
    """One cluster: its spec (from the store) and what exists of it (from Docker)."""

    def __init__(self, env: Env, name: str, spec: ClusterSpec | None = None):
        self.env = env
        self.name = name
        self._spec = spec

    @property
    def p(self) -> DockerProvider:
        return self.env.provider

    @property
    def store(self) -> Store:
        return self.env.store

    @property
    def spec(self) -> ClusterSpec:
        if self._spec is None:
            row = self.store.cluster(self.name)
            if row is None:
                raise NotFound(f"cluster {self.name!r} does not exist")
            self._spec = validate(row.spec, self.env.catalogue)
        return self._spec

    def reload(self, spec: dict | None = None) -> ClusterSpec:
        """Read the spec again (or take `spec`, a stored spec document just read)."""
        self._spec = validate(spec, self.env.catalogue) if spec is not None else None
        return self.spec

    @property
    def controller_host(self) -> str:
        return controller_host(self.spec)

    @property
    def controller_container(self) -> str:
        return container_name(self.name, self.controller_host)

    @property
    def slurm(self) -> Slurm:
        return Slurm(self.p, self.controller_container)

    @property
    def dir(self) -> Path:
        return self.store.cluster_dir(self.name)

    @property
    def key_path(self) -> Path:
        return self.dir / "slurm.key"

    def make_key(self) -> bytes:
        key = secrets.token_bytes(64)
        fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key

    def key(self) -> bytes:
        return self.key_path.read_bytes()

    def containers(self) -> list[ContainerInfo]:
        return self.p.containers(self.name)

    def node_containers(self) -> dict[str, ContainerInfo]:
        """Slurm node name -> its container (controller, login and workers)."""
        return {c.labels[L_NODE]: c for c in self.containers()
                if L_NODE in c.labels and c.labels.get(L_ROLE) in NODE_ROLES}

    def group_of(self, name: str) -> InstanceGroup:
        g = self.spec.group(name)
        if g is None:
            raise BadInput(f"cluster {self.name!r} has no instance group {name!r} "
                           f"(groups: {', '.join(x.InstanceGroupName for x in self.spec.InstanceGroups)})")
        return g


class Launcher:
    """Creates and starts node containers. Every failure is classified (LaunchError)
    where it is observed: capacity and transient faults are retryable, a missing
    image is not."""

    def __init__(self, cluster: Cluster, images: dict[str, str]):
        self.c = cluster
        self.images = images

    def container_spec(self, group: InstanceGroup, index: int, gpus: list[str] | None = None,
                       drain_reason: str | None = None) -> ContainerSpec:
        c = self.c
        role = ROLE_BY_NODE_TYPE[group.node_type]
        itype = c.env.catalogue[group.InstanceType]
        node = node_name(group.InstanceGroupName, index)
        env = {"HP_CONTROLLER": c.controller_host, "HP_CLUSTER": c.name}
        vols = {shared_volume(c.name): "/home"}
        if role == "worker":
            env["HP_SLURMD_CONF"] = itype.slurmd_conf(group.InstanceGroupName.lower())
            if drain_reason or group.OnStartDeepHealthChecks:
                # the node registers drained, so it takes no job before its (on-start) check passes
                env["HP_SLURMD_CONF"] += f" State=DRAIN Reason={drain_reason or ONSTART_REASON}"
        if role == "controller":
            vols = {state_volume(c.name): "/var/spool/slurmctld"}
        lab = labels(c.name, role, group.InstanceGroupName, node, index, itype.name)
        if gpus:
            lab["io.hp.gpus"] = ",".join(gpus)
        return ContainerSpec(
            name=container_name(c.name, node), image=group.Image or self.images[role], hostname=node,
            labels=lab, network=network_name(c.name), environment=env, volumes=vols,
            cpu_limit=itype.cpu_limit, memory_mib=itype.memory_mib, gpus=gpus or [],
        )

    def create_many(self, wanted: list[tuple[InstanceGroup, int]],
                    files: dict[str, tuple[bytes, int, int]] | None = None,
                    drain_reason: str | None = None) -> dict[str, str | LaunchError]:
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
                used = capacity.Usage(used.cpus + itype.cpu_limit, used.memory_mib + itype.memory_mib,
                                      used.gpus | set(gpus or []),
                                      {**used.per_type, itype.name: used.per_type.get(itype.name, 0) + 1})
                todo.append((g, i, gpus))
            results = parallel(lambda t: self._create_one(t[0], t[1], t[2], files, drain_reason), todo)
        for (g, i, _), r in zip(todo, results):
            out[node_name(g.InstanceGroupName, i)] = r
        return out

    def _create_one(self, group: InstanceGroup, index: int, gpus: list[str] | None,
                    files: dict[str, tuple[bytes, int, int]] | None, drain_reason: str | None) -> str | LaunchError:
        c = self.c
        spec = self.container_spec(group, index, gpus, drain_reason)
        try:
            cid = c.p.create_container(spec)
            put = {"slurm.key": (c.key(), 0o600, SLURM_UID if group.node_type == "Controller" else 0)}
            put.update(files or {})
            c.p.put_files(cid, "/etc/slurm", put)
            return cid
        except LaunchError as e:
            return e
        except Exception as e:  # noqa: BLE001 - the engine refused: transient, retry later
            return LaunchError("ContainerCreateFailed", f"{spec.name}: {str(e)[:300]}", retryable=True)

    def start(self, cid: str) -> LaunchError | None:
        try:
            self.c.p.start(cid)
            return None
        except Exception as e:  # noqa: BLE001 - e.g. a port or device conflict: retry later
            return LaunchError("ContainerStartFailed", str(e)[:300], retryable=True)


def parallel(fn: Callable[[T], R], items: Sequence[T], workers: int = 32) -> list[R]:
    """Map over items on threads (Docker calls are I/O); results in order."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(fn, items))


def index_of(c: ContainerInfo) -> int:
    return int(c.labels.get(L_INDEX, "0"))


def role_of(c: ContainerInfo) -> str:
    return c.labels.get(L_ROLE, "")
