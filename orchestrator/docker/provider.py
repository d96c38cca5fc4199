"""The provider interface: the container-engine operations hp needs, and nothing more
(kind's provider interface is the model).

Implementations:
- `DockerEngine` (engine.py): one Docker engine through docker-py (the default: the
  local engine, or DOCKER_HOST).
- `MultiHostProvider` (multihost.py): several registered hosts' engines joined in a
  Docker swarm, used when hosts are registered (`hp hosts add`): every call goes to the
  engine that owns the container (or, for a new one, to `ContainerSpec.host`); lists
  and events are merged from every host; networks are attachable swarm overlays.
- an in-memory fake for unit tests of orchestration logic (tests/fakes.py).

Every method returns the typed views of views.py and raises the typed errors of
orchestrator.errors: `EngineUnavailable` (no engine answers), `ObjectMissing` (no such
container, image, network, volume), `EngineError` (the engine refused; `.status`),
never a docker-py exception. Labels are the truth of what exists: `containers`,
`networks` and `volumes` select by the cluster label (or every hp-managed object).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from .views import (
    Container,
    ContainerDetails,
    ContainerSpec,
    EngineInfo,
    EventStream,
    ExecHandle,
    ExecResult,
    LineStream,
    Network,
    Volume,
)

FileMap = dict[str, tuple[bytes, int, int]]  # name -> (content, mode, uid)
Log = Callable[[str], None]


@runtime_checkable
class Provider(Protocol):
    # -- the engine -------------------------------------------------------------------
    def ping(self) -> None:
        """Raise EngineUnavailable (with how to start one) unless an engine answers."""

    def info(self) -> EngineInfo:
        """The engine's host: CPUs, memory, architecture, runtimes, swarm role."""

    # -- hosts (one engine: {LOCAL_ENGINE: self}, nothing unreachable, images already here)
    def engines(self) -> dict[str, Provider]:
        """The engines behind this provider by host name, in the hosts' order:
        {LOCAL_ENGINE: self} for one engine. Capacity and placement are decided per engine."""

    def image_source(self) -> Provider:
        """The engine hp builds and keeps its images on: itself for one engine, the local
        engine for registered hosts (which get the images from it, `prepare_images`)."""

    def unreachable(self, refresh: bool = False) -> dict[str, str]:
        """Hosts whose engine did not answer the last look (host -> why); {} for one
        engine, whose failures raise EngineUnavailable instead. `refresh`: look now."""

    def prepare_images(self, refs: list[str], log: Log) -> None:
        """Make sure every reachable host has these images (by image id), streamed from
        the local engine (one save, fanned out) or pulled from $HP_REGISTRY."""

    # -- the runtime's part of a cluster: what differs between one engine and several
    # hosts is answered here, so that nothing above asks which of them it runs on
    places_nodes: bool
    """Nodes are placed on named hosts: placements are recorded, a spec's Placement.Hosts
    names them, a host can be lost with its nodes (the host watch). False on one engine."""

    reaches_addresses: bool
    """This machine reaches a container's address on a cluster's network (one engine's
    bridge); False across hosts (a swarm overlay: the REST front relays through an exec)."""

    def cluster_images(self) -> tuple[str, ...]:
        """The images (by name, docker/images.py) a cluster needs beyond hp's node images:
        () on one engine; across hosts the /home-mounting node image and the file server."""

    def node_image(self, role: str) -> str:
        """The image (by name) a node of `role` (controller, login, worker) runs."""

    def prepare_cluster(self, cluster: str, labels: dict[str, str], encrypted: bool, accounting: bool) -> None:
        """Create's first step: the cluster's network (`labels` added to hp's), and the
        volumes made before any container (one engine: state, shared /home, the database's
        with `accounting`; across hosts none: each is made on the host of the container
        that mounts it, `place`). `encrypted`: IPsec between hosts."""

    def place(self, spec: ContainerSpec, cluster: str, role: str, host: str) -> None:
        """The runtime's part of a cluster container's spec (a node's or a service's),
        given the host it was placed on: nothing on one engine; across hosts the container
        goes to `host` (labelled so), its volumes are made there, and login and compute
        nodes mount /home from the cluster's file server instead of a volume."""

    # -- networks and volumes -----------------------------------------------------------
    def create_network(self, name: str, labels: dict[str, str], encrypted: bool = False) -> str:
        """A cluster's network: a bridge on one engine; an attachable swarm overlay
        (`encrypted`: IPsec between hosts) across hosts."""

    def remove_network(self, name_or_id: str) -> None:
        """Remove a network; one that does not exist is no error."""

    def networks(self, cluster: str | None = None) -> list[Network]: ...

    def create_volume(self, name: str, labels: dict[str, str]) -> None: ...

    def remove_volume(self, name: str) -> None:
        """Remove a volume; one that does not exist is no error."""

    def volumes(self, cluster: str | None = None) -> list[Volume]: ...

    # -- containers ---------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> str:
        """Create (not start) a container; its id. A missing image is ObjectMissing; a
        name in use is an EngineError with status 409."""

    def start(self, container: str) -> None: ...

    def restart(self, container: str, timeout: int = 2) -> None: ...

    def kill(self, container: str) -> None:
        """Kill a running container; one that does not exist or is stopped is no error."""

    def remove_container(self, container: str) -> None:
        """Remove (forcibly) a container; one that does not exist is no error."""

    def containers(self, cluster: str | None = None, extra_labels: dict[str, str] | None = None) -> list[Container]:
        """hp's containers (of one cluster), running or not, with `extra_labels` too; an
        io.hp.managed among them replaces hp's mark (its helpers, e.g. the GPU probe, are 0)."""

    def inspect(self, container: str) -> ContainerDetails: ...

    def logs(self, container: str, tail: int | str = "all") -> str: ...

    def follow_logs(self, container: str, since: float | None = None) -> LineStream:
        """A container's output lines (stdout and stderr) as they come, from `since`
        (epoch seconds; None: from its start), until it stops or close() is called.
        One open stream per follower: it costs a blocked read, no polling."""

    def run_once(self, spec: ContainerSpec, timeout: float = 120.0) -> ExecResult:
        """Create, start and wait for a short-lived container; its exit code and output
        (stdout and stderr). The container is removed whatever happens; one still
        running after `timeout` seconds is killed (EngineError, status 408)."""

    def put_files(self, container: str, directory: str, files: FileMap) -> None:
        """Copy files into a container, created or running."""

    def get_file(self, container: str, path: str) -> bytes: ...

    def get_dir(self, container: str, path: str) -> dict[str, bytes]:
        """Regular files under a folder of a container (relative name -> content); {} if absent."""

    # -- exec ---------------------------------------------------------------------------
    def exec(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command (an argv list: no shell) and collect its output (stdout and
        stderr merged). A container that is not running is an EngineError (409)."""

    def exec_stream(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecHandle: ...

    def exec_exit_code(self, handle: ExecHandle) -> int: ...

    def exec_interactive(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> int:
        """Run a command with this process's terminal attached; its exit code."""

    def events(self, cluster: str | None = None) -> EventStream:
        """Container events of hp's containers (of one cluster), as they happen; close()
        ends the stream."""

    # -- images -------------------------------------------------------------------------
    def image_id(self, ref: str) -> str | None: ...

    def pull(self, repo: str, tag: str) -> None: ...

    def import_image(self, tar_path: Path, repo: str, tag: str, changes: list[str]) -> None: ...

    def build_image(self, context: Path, tag: str, target: str | None, buildargs: dict[str, str], log: Log) -> None: ...

    def tag_image(self, ref: str, repo: str, tag: str) -> None: ...

    def save_images(self, refs: list[str]) -> Iterator[bytes]:
        """One tar of several images (layers they share stored once)."""

    def load_images(self, data: IO[bytes] | bytes | Iterable[bytes]) -> list[str]: ...

    def read_image_file(self, ref: str, path: str) -> bytes:
        """A file of an image, without running it."""
