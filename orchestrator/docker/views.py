"""Small typed views of what a container engine holds, and the requests hp makes of it.

Nothing outside `orchestrator.docker` sees a docker-py object or one of the engine's raw
JSON documents: providers return these.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..naming import L_GPUS, L_GROUP, L_INDEX, L_ITYPE, L_NODE, L_ROLE, NODE_ROLES

LOCAL_ENGINE = ""
"""The host name of the one engine a provider of a single engine has (the local engine, or
DOCKER_HOST): its `engines()` are {LOCAL_ENGINE: itself}, its containers' `host`. Registered
hosts have names of their own (hp hosts add), never this one."""


@dataclass(frozen=True)
class Limits:
    """A container's cgroup limits as the engine reports them now (0: none)."""

    nano_cpus: int = 0
    cpu_quota: int = 0
    cpu_period: int = 0
    memory_bytes: int = 0

    @property
    def granted_cpus(self) -> float | None:
        if self.nano_cpus:
            return self.nano_cpus / 1e9
        if self.cpu_quota > 0:
            return self.cpu_quota / (self.cpu_period or 100000)
        return None

    @property
    def memory_mib(self) -> float | None:
        return self.memory_bytes / 2**20 if self.memory_bytes else None


class _Labelled:
    """What a container's or an event's labels say of hp's node."""

    labels: dict[str, str]

    @property
    def node(self) -> str | None:
        return self.labels.get(L_NODE)

    @property
    def role(self) -> str:
        return self.labels.get(L_ROLE, "")


@dataclass(frozen=True)
class Container(_Labelled):
    """One container, as listed (cheap: one call lists them all)."""

    id: str
    name: str
    labels: dict[str, str]
    state: str  # created, running, exited, dead, restarting, paused, removing
    exit_code: int
    created: str  # ISO 8601
    image: str
    ip: str | None
    host: str = LOCAL_ENGINE  # the engine (host) it lives on
    image_id: str = ""  # its image's id, as listed ("" when not known)

    @property
    def group(self) -> str:
        return self.labels.get(L_GROUP, "")

    @property
    def itype(self) -> str:
        return self.labels.get(L_ITYPE, "")

    @property
    def index(self) -> int:
        try:
            return int(self.labels.get(L_INDEX, "0"))
        except ValueError:
            return 0

    @property
    def gpus(self) -> list[str]:
        return [g for g in self.labels.get(L_GPUS, "").split(",") if g]

    @property
    def is_node(self) -> bool:
        return self.node is not None and self.role in NODE_ROLES

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def dead(self) -> bool:
        return self.state in ("exited", "dead")


@dataclass(frozen=True)
class ContainerState:
    status: str
    running: bool
    exit_code: int
    oom_killed: bool
    started_at: str
    finished_at: str
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """In the engine's own words (as `docker inspect` shows State)."""
        return {
            "Status": self.status,
            "Running": self.running,
            "ExitCode": self.exit_code,
            "OOMKilled": self.oom_killed,
            "StartedAt": self.started_at,
            "FinishedAt": self.finished_at,
            "Error": self.error,
        }


@dataclass(frozen=True)
class ContainerDetails:
    """One container inspected (one call per container)."""

    id: str
    name: str
    image: str
    labels: dict[str, str]
    state: ContainerState
    limits: Limits
    host: str = LOCAL_ENGINE
    # network name -> the container's IPv4 address on it (a cluster's services are reached
    # there, never through a port published on the host)
    addresses: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Network:
    id: str
    name: str
    labels: dict[str, str]
    driver: str = "bridge"
    host: str = LOCAL_ENGINE


@dataclass(frozen=True)
class Volume:
    name: str
    labels: dict[str, str]
    host: str = LOCAL_ENGINE


@dataclass(frozen=True)
class Event(_Labelled):
    """A container event of one of hp's containers (die, start, oom, destroy, create...)."""

    action: str
    container: str  # id
    labels: dict[str, str]
    time: float
    exit_code: int | None = None
    host: str = LOCAL_ENGINE


@dataclass(frozen=True)
class EngineInfo:
    """What hp needs to know of an engine (its host's size, kind and swarm role)."""

    name: str
    server_version: str
    os: str
    arch: str
    cpus: int
    memory_bytes: int
    runtimes: tuple[str, ...] = ()
    cdi_spec_dirs: tuple[str, ...] = ()
    swarm_state: str = "inactive"  # inactive, pending, active, error, locked
    swarm_node_id: str = ""
    swarm_manager: bool = False
    cgroup_version: str = ""
    swarm_addr: str = ""  # this node's address in the swarm (NodeAddr)
    swarm_cluster_id: str = ""  # the swarm it belongs to ("" when none, or not a manager)

    @property
    def memory_mib(self) -> int:
        return self.memory_bytes // (1024 * 1024)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str


class DeviceWiring(Protocol):
    """What the engine adds to a container for its devices (a node's GPUs: gpu/wiring.py's
    GpuWiring): "host:container:rwm" device mappings, "host:container:ro" binds, docker-py
    DeviceRequest keyword mappings, environment."""

    @property
    def devices(self) -> Sequence[str]: ...

    @property
    def binds(self) -> Sequence[str]: ...

    @property
    def device_requests(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass
class ContainerSpec:
    """A container to create. `network` attaches it to a named network (with its
    hostname as alias; "none": no network at all); `network_of` puts it in another
    container's network namespace (health-check containers). `gpus` is a node's GPU
    wiring (orchestrator/gpu/wiring.py): devices, read-only binds, device requests and
    environment the engine adds."""

    name: str
    image: str
    labels: dict[str, str]
    hostname: str | None = None
    network: str | None = None
    network_of: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    volumes: dict[str, str] = field(default_factory=dict)  # volume name -> mount path
    binds: list[str] = field(default_factory=list)  # host paths: "host:container:ro" (or rw)
    cpu_limit: float | None = None  # cores (NanoCpus)
    cpu_quota: int | None = None  # or a CFS quota and period
    cpu_period: int | None = None
    memory_bytes: int | None = None
    gpus: DeviceWiring | None = None
    command: list[str] | None = None
    entrypoint: list[str] | None = None  # None: the image's
    cap_add: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # "src:dst:rwm"
    security_opt: list[str] = field(default_factory=list)
    init: bool = True
    # Multi-host: the registered host to create it on (LOCAL_ENGINE: the only one; for a
    # check container, its node's host), and labels for the named volumes of `volumes`
    # that the engine must create on that host when missing.
    host: str = LOCAL_ENGINE
    volume_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    restart_policy: str | None = None  # Docker's: "unless-stopped", "on-failure"...; None: never


class EventStream(Protocol):
    def __iter__(self) -> Iterator[Event]: ...

    def close(self) -> None: ...


class LineStream(Protocol):
    """A container's output, line by line, as it comes; close() ends it (from any thread)."""

    def __iter__(self) -> Iterator[str]: ...

    def close(self) -> None: ...


@dataclass
class ExecHandle:
    """A streaming exec under way: its output chunks, and a way to get its exit code."""

    chunks: Iterator[tuple[bytes | None, bytes | None]]
    id: str
