"""What every operation needs: the process-wide handles (`Env`), one cluster's context
(`Cluster`), and a small helper to run Docker calls in parallel."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..docker.engine import DockerEngine
from ..docker.images import Images
from ..docker.provider import Provider
from ..docker.views import Container
from ..errors import TRANSIENT, BadInput, NotFound
from ..naming import container_name
from ..slurm.client import Slurm, SlurmCli
from ..slurm.conf import controller_host
from ..spec.catalogue import InstanceType, load_catalogue
from ..spec.model import ClusterSpec, InstanceGroup, validate
from ..state.store import Store

if TYPE_CHECKING:  # pragma: no cover
    from ..gpu.host import HostGpuInfo

log = logging.getLogger("hp")
T = TypeVar("T")
R = TypeVar("R")
SLURM_UID = 64030  # Debian's fixed uid for the slurm user
DEFAULT_USER = "hpuser"
DEFAULT_UID = 1000


class Agents(Protocol):
    """The per-cluster background agents (agent/process.py; a no-op fake in unit tests)."""

    def ensure(self, name: str) -> dict: ...

    def poke(self, name: str) -> None: ...

    def stop(self, name: str) -> None: ...

    def creation_lock(self, name: str) -> AbstractContextManager[None]: ...


@dataclass
class Env:
    """Process-wide handles, made once per command and passed down (no globals)."""

    provider: Provider = field(default_factory=DockerEngine)
    store: Store = field(default_factory=Store)
    slurm_factory: Callable[[Provider, str], Slurm] = SlurmCli
    agents: Agents = None  # type: ignore[assignment]  # default: real agent processes of `store`
    catalogue_file: str | None = None

    def __post_init__(self) -> None:
        if self.agents is None:
            from ..agent.process import AgentProcesses

            self.agents = AgentProcesses(self.store)

    @cached_property
    def catalogue(self) -> dict[str, InstanceType]:
        """The instance types: shipped, GPU types named after the host's GPUs (only
        where there are GPUs), and the user's file. Without an engine (or when
        discovery fails) there are no discovered types."""
        discovered: dict[str, dict] = {}
        try:
            discovered = {t.name: t.catalogue_entry() for t in self.gpus().instance_types()}
        except TRANSIENT as e:
            log.info("GPU discovery failed, no GPU types from it: %s", e)
        return load_catalogue(self.catalogue_file, discovered)

    def gpus(self, refresh: bool = False) -> HostGpuInfo:
        """The Docker host's GPUs (gpu/host.py: discovery cached in the store, or HP_GPUS)."""
        from ..gpu.host import discover

        return discover(self.provider, self.store, refresh=refresh)

    @cached_property
    def images(self) -> Images:
        return Images(self.provider)

    def cluster(self, name: str) -> Cluster:
        """An existing cluster (NotFound, exit 2, when there is none of that name)."""
        if self.store.cluster(name) is None:
            raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
        return Cluster(self, name)


class Cluster:
    """One cluster: its spec (from the store) and what exists of it (from Docker)."""

    def __init__(self, env: Env, name: str, spec: ClusterSpec | None = None):
        self.env = env
        self.name = name
        self._spec = spec

    @property
    def p(self) -> Provider:
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
            self._spec = validate(row.spec, self.env.catalogue, existing=True)
        return self._spec

    def reload(self, spec: dict | None = None) -> ClusterSpec:
        """Read the spec again (or take `spec`, a stored spec document just read)."""
        self._spec = validate(spec, self.env.catalogue, existing=True) if spec is not None else None
        return self.spec

    @property
    def controller_host(self) -> str:
        return controller_host(self.spec)

    @property
    def controller_container(self) -> str:
        return container_name(self.name, self.controller_host)

    @cached_property
    def slurm(self) -> Slurm:
        return self.env.slurm_factory(self.p, self.controller_container)

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

    def containers(self) -> list[Container]:
        return self.p.containers(self.name)

    def node_containers(self) -> dict[str, Container]:
        """Slurm node name -> its container (controller, login and workers)."""
        return {c.node: c for c in self.containers() if c.is_node and c.node}

    def group_of(self, name: str) -> InstanceGroup:
        g = self.spec.group(name)
        if g is None:
            raise BadInput(
                f"cluster {self.name!r} has no instance group {name!r} "
                f"(groups: {', '.join(x.InstanceGroupName for x in self.spec.InstanceGroups)})"
            )
        return g


def parallel(fn: Callable[[T], R], items: Sequence[T], workers: int = 32) -> list[R]:
    """Map over items on threads (Docker calls are I/O); results in order. An exception
    in one call is raised here, after every call has finished."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(fn, items))
