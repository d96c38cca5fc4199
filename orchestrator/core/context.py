"""What every operation needs: the process-wide handles (`Env`), one cluster's context
(`Cluster`), and a small helper to run Docker calls in parallel.

Every command holds an Env, and most a Cluster; what only some of them use is loaded when
first used: the spec's model and its validation (pydantic), the instance types (YAML),
GPU discovery and the images' builds. `hp exec` loads none of them, nor does `hp nodes` on
a healthy cluster (cluster/query.py); a stored spec that names only shipped and user
instance types is judged without GPU discovery (Env.catalogue looks discovered types up
only for other names)."""

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

from ..docker.provider import Provider
from ..docker.views import LOCAL_ENGINE, Container
from ..errors import TRANSIENT, BadInput, NotFound
from ..naming import container_name
from ..releases import SlurmRelease
from ..slurm.client import Slurm
from ..state.phases import Phase
from ..state.store import Latest, Store

if TYPE_CHECKING:
    from ..docker.images import Images
    from ..gpu.inventory import HostGpuInfo
    from ..spec.catalogue import Catalogue
    from ..spec.model import ClusterSpec, InstanceGroup

log = logging.getLogger("hp")
T = TypeVar("T")
R = TypeVar("R")
SLURM_UID = 64030  # Debian's fixed uid for the slurm user


class Agents(Protocol):
    """The per-cluster background agents (core/agents.py; a no-op fake in unit tests)."""

    def ensure(self, name: str) -> dict: ...

    def poke(self, name: str) -> None: ...

    def stop(self, name: str) -> None: ...

    def creation_lock(self, name: str) -> AbstractContextManager[None]: ...


@dataclass
class Env:
    """Process-wide handles, made once per process and passed down (no globals): a plain
    holder of its parts. Which parts hp runs with (the provider, the Slurm client, the
    store, the agents) is decided in one place, orchestrator/assembly.py; unit tests give
    fakes."""

    provider: Provider
    store: Store
    slurm_factory: Callable[[Provider, str], Slurm]
    agents: Agents
    catalogue_file: str | None = None
    _images: dict[SlurmRelease, Images] = field(default_factory=dict, repr=False)

    @cached_property
    def catalogue(self) -> Catalogue:
        """The instance types: shipped, GPU types named after the host's GPUs (only
        where there are GPUs; discovered when a name is not a shipped or user type, or the
        whole catalogue is listed: spec/catalogue.py), and the user's file. Without an
        engine (or when discovery fails) there are no discovered types."""
        from ..spec.catalogue import Catalogue

        return Catalogue(self.catalogue_file, self._discovered_types)

    def _discovered_types(self) -> dict[str, dict]:
        discovered: dict[str, dict] = {}
        down = self.provider.unreachable()
        for host in self.provider.engines():  # every host's GPU types (one engine: its own)
            if host in down:  # its types come back with it
                continue
            try:
                discovered.update({t.name: t.catalogue_entry() for t in self.gpus(host=host).instance_types()})
            except TRANSIENT as e:
                log.info("GPU discovery failed%s, no GPU types from it: %s", f" on {host}" if host else "", e)
        return discovered

    def node_image_defs(self) -> tuple:
        """The images nodes run: hp's, and those the provider's clusters need besides
        (Provider.cluster_images: across hosts, the login and worker image that mounts
        /home from the cluster's file server, and that server)."""
        from ..docker.images import NODE_IMAGES, cluster_images

        return NODE_IMAGES + cluster_images(self.provider)

    def gpus(self, refresh: bool = False, host: str = LOCAL_ENGINE) -> HostGpuInfo:
        """A Docker host's GPUs (gpu/inventory.py: discovery cached in the store, or HP_GPUS):
        the one engine's, or a registered host's (the first one when `host` is LOCAL_ENGINE)."""
        from ..gpu import inventory

        engines = self.provider.engines()
        engine = engines.get(host) or next(iter(engines.values()))
        return inventory.discover(engine, self.store, refresh=refresh)

    def images(self, release: SlurmRelease) -> Images:
        """One Slurm release's images (docker/images.py), made once per process."""
        if release not in self._images:
            from ..docker.images import Images

            self._images[release] = Images(self.provider, release)
        return self._images[release]

    def slurm_version(self, ref: str, image_id: str = "") -> str | None:
        """Slurm's exact version in an image (docker/images.py), remembered per image id in
        the store: images are immutable. None when the image is absent or has no slurmd.
        `image_id`, when the caller has it (a container's listing): no inspect of `ref`."""
        from ..docker.images import slurm_version

        image_id = image_id or self.provider.image_id(ref)
        if image_id is None:
            return None
        kv = f"slurm-version:{image_id}"
        if (known := self.store.get(kv)) is not None:
            return known
        version = slurm_version(self.provider, ref)
        if version:
            self.store.put(kv, version)
        return version

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
            self._spec = self._validate(row.spec)
        return self._spec

    def reload(self, spec: dict | None = None) -> ClusterSpec:
        """Read the spec again (or take `spec`, a stored spec document just read)."""
        self._spec = self._validate(spec) if spec is not None else None
        return self.spec

    def _validate(self, raw: dict) -> ClusterSpec:
        """A stored spec document, judged with the instance types it names (Env.catalogue)."""
        from ..spec.model import validate

        return validate(raw, self.env.catalogue, existing=True)

    @property
    def images(self) -> Images:
        """The images of the cluster's Slurm release."""
        return self.env.images(self.spec.release)

    @property
    def controller_node(self) -> str:
        """The controller's Slurm node name (a "host" in hp is a Docker host only)."""
        from ..slurm.conf import controller_node

        return controller_node(self.spec)

    @property
    def controller_container(self) -> str:
        return container_name(self.name, self.controller_node)

    @cached_property
    def slurm(self) -> Slurm:
        return self.env.slurm_factory(self.p, self.controller_container)

    def slurm_in(self, container: str) -> Slurm:
        """Slurm's commands run in `container`: the controller's found by controller_of,
        without reading the spec (`slurm` is the same client on the container it names)."""
        return self.env.slurm_factory(self.p, container)

    @staticmethod
    def controller_of(containers: dict[str, Container]) -> Container | None:
        """The controller's container in a listing of the nodes' (node_containers), known
        by its role label: the spec is not read."""
        return next((c for c in containers.values() if c.role == "controller"), None)

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

    def placements(self) -> dict[str, str]:
        """Node -> the host its current container was placed on ({} where the provider
        places no nodes: one engine)."""
        return self.store.node_hosts(self.name) if self.p.places_nodes else {}

    def current(self, containers: list[Container], placements: dict[str, str] | None = None) -> list[Container]:
        """The containers that are a node's current one: on several hosts, a copy on
        another host than the node's placement is stale (left on a host that was lost
        while the node was replaced elsewhere) and is left out, so that nothing acts on it."""
        placed = self.placements() if placements is None else placements
        if not placed:  # nothing placed (one engine): every container is its node's
            return containers
        return [c for c in containers if not (c.node and placed.get(c.node) and c.host != placed[c.node])]

    def node_containers(self) -> dict[str, Container]:
        """Slurm node name -> its container (controller, login and workers)."""
        return {c.node: c for c in self.current(self.containers()) if c.is_node and c.node}

    def lost_nodes(
        self,
        containers: dict[str, Container] | None = None,
        latest: Latest | None = None,
        placed: dict[str, str] | None = None,
    ) -> dict[str, tuple[str, str]]:
        """Nodes whose host does not answer, and that hp cannot see: node -> (host, why).
        Their containers may still be there; they are neither missing (nothing relaunches
        them on its own) nor healthy (the host watcher replaces them, or waits).

        A caller that judges nodes passes what it read, in the order replacement writes
        in reverse: the placements (`placed`), then the phases (`latest`), then the
        containers. A replacement records Replacing, then the new host, then makes the
        container: read in that reverse order, a node is always lost (old host, phase
        not yet Replacing), replacing, or seen; read otherwise (or twice) a node read as
        Running and placed on its new host before its container exists is none of them."""
        placed = self.placements() if placed is None else placed
        if not placed:  # no node placed on a host (one engine): none lost with one
            return {}
        if latest is None:
            latest = self.store.latest_phases(self.name)
        seen = self.node_containers() if containers is None else containers
        down = self.p.unreachable()  # after the listing, which finds the hosts that do not answer
        if not down:
            return {}
        held = (Phase.RUNNING, Phase.LAUNCHING, Phase.CHECKING, Phase.REBOOTING)
        return {n: (h, down[h]) for n, h in placed.items() if h in down and n not in seen and latest.phase(n) in held}

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
