"""In-memory fakes behind hp's Protocols, for unit tests of orchestration logic only
(the end-to-end tests use real Docker and real Slurm).

- FakeProvider: the Provider (orchestrator.docker.provider) as a dict of containers,
  networks, volumes and images; exec answers through `exec_handler`, one-shot
  containers (run_once) through `run_handler` (by default the GPU probe of a host
  without GPUs), followed logs through `push_log`.
- gpu_host(provider, n): make the fake engine's host one with n H200 GPUs (the real
  H200's nvidia-smi -q -x, copied per GPU).
- FakeSlurm: the Slurm interface (orchestrator.slurm.client) as a dict of nodes. Worker
  containers that start register in it (with the drain their slurmd --conf asks for)
  when `auto_register` is on, as slurmd would. Accounting answers from `acct_ping` (or,
  by default, from the services' containers: slurmdbd's, with its database, running).
- service_started(p): a container that runs accounting's daemons says in its log, when
  it starts, what they say when ready (MariaDB's "ready for connections", then slurmdbd's
  "... started"): the controller's when it was given slurmdbd.conf (hp-entry then runs
  them beside slurmctld), an older cluster's accounting (or database) container.
- FakeAgents: agent process control that starts nothing.
- world(): an Env wired with all three and a private Store; multi_world(): the same
  over a MultiHostProvider of several fake engines (registered hosts h1, h2, ...), the
  first a swarm manager, images coming from a fake local engine.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from orchestrator.core.context import Env
from orchestrator.docker.engine import prepare_one_engine
from orchestrator.docker.views import (
    LOCAL_ENGINE,
    Container,
    ContainerDetails,
    ContainerSpec,
    ContainerState,
    EngineInfo,
    Event,
    ExecHandle,
    ExecResult,
    Limits,
    Network,
    Volume,
)
from orchestrator.errors import EngineError, EngineUnavailable, ObjectMissing, OperationFailed
from orchestrator.naming import L_CLUSTER, L_MANAGED
from orchestrator.releases import DEFAULT, RELEASES
from orchestrator.slurm.model import AccountingPing, AcctJob, AutoResumeRetry, JobInfo, OrphanJob, SlurmNode
from orchestrator.state.store import Store

_ids = itertools.count(1)


@dataclass
class FakeContainer:
    spec: ContainerSpec
    id: str
    state: str = "created"
    exit_code: int = 0
    files: dict[str, bytes] = field(default_factory=dict)
    logs: str = ""
    started_at: str = ""

    host: str = ""
    address: str = ""  # its IPv4 address on its network while running (a test sets one)
    image_id: str = ""

    def view(self) -> Container:
        return Container(
            self.id,
            self.spec.name,
            dict(self.spec.labels),
            self.state,
            self.exit_code,
            "2026-01-01T00:00:00Z",
            self.spec.image,
            "10.0.0.2" if self.state == "running" else None,
            self.host,
            self.image_id,
        )


class FakeStream:
    """Yields the events given, then blocks (as the engine's stream does) until closed."""

    def __init__(self, events: list[Event]):
        self.events = events
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[Event]:
        yield from self.events
        self._closed.wait(0.2)

    def close(self) -> None:
        self._closed.set()


class FakeLines:
    """A followed container's output: the lines it had, then what push_log adds,
    until closed (or its container is removed)."""

    def __init__(self, lines: list[str]):
        self.q: queue.Queue[str | None] = queue.Queue()
        for line in lines:
            self.q.put(line)
        self.closed = False

    def __iter__(self) -> Iterator[str]:
        while True:
            line = self.q.get()
            if line is None:
                return
            yield line

    def close(self) -> None:
        self.closed = True
        self.q.put(None)


class FakeProvider:
    """One fake engine; `name` is its host's name when it stands for a registered host
    (a MultiHostProvider over several fakes: tests/unit/test_multihost.py)."""

    def __init__(self, cpus: int = 8, memory_mib: int = 16384, name: str = ""):
        self.up = True
        self.name = name
        self.info_ = EngineInfo(name or "fake", "26.1", "Debian", "x86_64", cpus, memory_mib * 2**20)
        self.containers_: dict[str, FakeContainer] = {}
        self.networks_: dict[str, Network] = {}
        self.volumes_: dict[str, Volume] = {}
        self.images: dict[str, str] = {}
        self.exec_handler: Callable[[FakeContainer, list[str]], ExecResult] | None = None
        self.on_start: list[Callable[[FakeContainer], None]] = []
        self.on_logs: list[Callable[[FakeContainer], None]] = []  # before a container's log is read
        self.fail_create: Callable[[ContainerSpec], EngineError | None] = lambda spec: None
        self.fail_start: Callable[[FakeContainer], EngineError | None] = lambda c: None
        self.events_: list[Event] = []
        # one-shot containers (run_once): the spec -> what it printed and its exit code
        self.run_handler: Callable[[ContainerSpec], ExecResult] = lambda spec: ExecResult(0, probe_output())
        self.runs: list[ContainerSpec] = []
        self.followers: dict[str, list[FakeLines]] = {}
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.RLock()

    # -- engine
    def _check(self) -> None:
        if not self.up:
            raise EngineUnavailable("cannot reach a Docker engine (fake engine down)")

    def ping(self, timeout: float | None = None) -> None:
        self._check()

    def info(self, refresh: bool = False) -> EngineInfo:
        self._check()
        return self.info_

    def engines(self) -> dict[str, Any]:
        return {LOCAL_ENGINE: self}

    def image_source(self) -> FakeProvider:
        return self

    def unreachable(self, refresh: bool = False) -> dict[str, str]:
        return {}

    def prepare_images(self, refs: list[str], log: Callable[[str], None]) -> None:
        pass

    # the runtime's part of a cluster: one engine (DockerEngine's answers)
    places_nodes = False
    reaches_addresses = True

    def cluster_images(self) -> tuple[str, ...]:
        return ()

    def node_image(self, role: str) -> str:
        return role

    def prepare_cluster(self, cluster: str, labels: dict[str, str], encrypted: bool, accounting: bool) -> None:
        prepare_one_engine(self, cluster, labels, encrypted, accounting)

    def place(self, spec: ContainerSpec, cluster: str, role: str, host: str) -> None:
        pass

    # -- networks, volumes
    def create_network(self, name: str, labels: dict[str, str], encrypted: bool = False) -> str:
        self._check()
        if encrypted:
            raise EngineError(f"create network {name}: an encrypted network needs registered hosts")
        if name in self.networks_:
            raise EngineError(f"network {name} exists", 409)
        self.networks_[name] = Network(f"net{next(_ids)}", name, dict(labels), "bridge", self.name)
        return self.networks_[name].id

    def create_overlay(self, name: str, labels: dict[str, str], encrypted: bool = False, mtu: int | None = None) -> str:
        """As a swarm manager would (the options are kept for tests to read)."""
        self._check()
        if name in self.networks_:
            raise EngineError(f"network {name} exists", 409)
        self.networks_[name] = Network(f"net{next(_ids)}", name, dict(labels), "overlay", self.name)
        self.overlay_options = {"encrypted": encrypted, "mtu": mtu}
        return self.networks_[name].id

    def remove_network(self, name_or_id: str) -> None:
        self._check()
        for k, n in list(self.networks_.items()):
            if name_or_id in (k, n.id):
                del self.networks_[k]

    def networks(self, cluster: str | None = None) -> list[Network]:
        self._check()
        return [n for n in self.networks_.values() if _match(n.labels, cluster)]

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        self._check()
        self.volumes_.setdefault(name, Volume(name, dict(labels), self.name))

    def remove_volume(self, name: str) -> None:
        self._check()
        self.volumes_.pop(name, None)

    def volumes(self, cluster: str | None = None) -> list[Volume]:
        self._check()
        return [v for v in self.volumes_.values() if _match(v.labels, cluster)]

    # -- containers
    def _get(self, ref: str) -> FakeContainer:
        self._check()
        with self.lock:
            for c in self.containers_.values():
                if ref in (c.id, c.spec.name):
                    return c
        raise ObjectMissing(f"no such container {ref}")

    def create_container(self, spec: ContainerSpec) -> str:
        self._check()
        if spec.image not in self.images and not spec.image.startswith("keep:"):
            raise ObjectMissing(f"create container {spec.name}: no such image {spec.image}")
        if err := self.fail_create(spec):
            raise err
        with self.lock:
            if any(c.spec.name == spec.name for c in self.containers_.values()):
                raise EngineError(f"create container {spec.name}: name in use", 409)
            cid = f"{next(_ids):08x}" + "0" * 56
            self.containers_[cid] = FakeContainer(spec, cid, host=self.name, image_id=self.images.get(spec.image, ""))
        self.calls.append(("create", spec.name))
        return cid

    def start(self, container: str) -> None:
        self._check()
        c = self._get(container)
        if err := self.fail_start(c):
            raise err
        with self.lock:  # its state and what its hooks write are seen together by other threads
            c.state, c.exit_code = "running", 0
            c.started_at = str(time.monotonic())
            self.calls.append(("start", c.spec.name))
            for hook in self.on_start:
                hook(c)

    def restart(self, container: str, timeout: int = 2) -> None:
        self.start(container)
        self.calls.append(("restart", self._get(container).spec.name))

    def kill(self, container: str) -> None:
        try:
            c = self._get(container)
        except ObjectMissing:
            return
        if c.state == "running":
            c.state, c.exit_code = "exited", 137

    def remove_container(self, container: str) -> None:
        try:
            c = self._get(container)
        except ObjectMissing:
            return
        with self.lock:
            self.containers_.pop(c.id, None)
            followers = self.followers.pop(c.spec.name, [])
        for f in followers:
            f.close()
        self.calls.append(("remove", c.spec.name))

    def containers(self, cluster: str | None = None, extra_labels: dict[str, str] | None = None) -> list[Container]:
        self._check()
        with self.lock:
            out = list(self.containers_.values())
        return [
            c.view()
            for c in out
            if (_match(c.spec.labels, cluster) or (not cluster and L_MANAGED in (extra_labels or {})))
            and all(c.spec.labels.get(k) == v for k, v in (extra_labels or {}).items())
        ]

    def inspect(self, container: str) -> ContainerDetails:
        c = self._get(container)
        s = c.spec
        return ContainerDetails(
            c.id,
            s.name,
            s.image,
            dict(s.labels),
            ContainerState(c.state, c.state == "running", c.exit_code, False, c.started_at, ""),
            Limits(int((s.cpu_limit or 0) * 1e9), s.cpu_quota or 0, s.cpu_period or 0, s.memory_bytes or 0),
            self.name,
            addresses={s.network: c.address} if c.address and s.network and c.state == "running" else {},
        )

    def logs(self, container: str, tail: int | str = "all") -> str:
        c = self._get(container)
        for hook in self.on_logs:
            hook(c)
        return c.logs

    def follow_logs(self, container: str, since: float | None = None) -> FakeLines:
        c = self._get(container)
        f = FakeLines(c.logs.splitlines())
        with self.lock:
            self.followers.setdefault(c.spec.name, []).append(f)
        return f

    def run_once(self, spec: ContainerSpec, timeout: float = 120.0) -> ExecResult:
        self._check()
        if spec.image not in self.images and not spec.image.startswith("keep:"):
            raise ObjectMissing(f"create container {spec.name}: no such image {spec.image}")
        self.runs.append(spec)
        self.calls.append(("run", spec.name))
        return self.run_handler(spec)

    def put_files(self, container: str, directory: str, files: dict[str, tuple[bytes, int, int]]) -> None:
        c = self._get(container)
        for name, (data, _, _) in files.items():
            c.files[f"{directory.rstrip('/')}/{name}"] = data

    def get_file(self, container: str, path: str) -> bytes:
        c = self._get(container)
        if path not in c.files:
            raise ObjectMissing(f"read {container}:{path}")
        return c.files[path]

    def get_dir(self, container: str, path: str) -> dict[str, bytes]:
        c = self._get(container)
        pre = path.rstrip("/") + "/"
        out = {k[len(pre) :]: v for k, v in c.files.items() if k.startswith(pre)}
        if path in c.files:
            out[Path(path).name] = c.files[path]
        return out

    # -- exec
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
        self._check()
        c = self._get(container)
        if c.state != "running":
            raise EngineError(f"run {cmd[0]} in {container}: container is not running", 409)
        self.calls.append(("exec", " ".join(cmd)))
        if self.exec_handler is None:
            return ExecResult(0, "")
        return self.exec_handler(c, cmd)

    def exec_stream(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecHandle:
        res = self.exec(container, cmd, user=user)
        self._last_code = res.exit_code
        return ExecHandle(iter([(res.output.encode(), None)]), f"ex{next(_ids)}")

    def exec_exit_code(self, handle: ExecHandle) -> int:
        return getattr(self, "_last_code", 0)

    def exec_interactive(self, container: str, cmd: list[str], **kw: Any) -> int:
        return self.exec(container, cmd).exit_code

    def events(self, cluster: str | None = None) -> FakeStream:
        self._check()
        return FakeStream([e for e in self.events_ if _match(e.labels, cluster)])

    # -- images
    def image_id(self, ref: str) -> str | None:
        self._check()
        return self.images.get(ref)

    def pull(self, repo: str, tag: str) -> None:
        raise EngineError(f"pull {repo}:{tag}: no registry", 500)

    def import_image(self, tar_path: Path, repo: str, tag: str, changes: list[str]) -> None:
        self.images[f"{repo}:{tag}"] = f"sha256:{next(_ids)}"

    def build_image(
        self, context: Path, tag: str, target: str | None, buildargs: dict[str, str], log: Callable[[str], None]
    ) -> None:
        log(f"Step 1/1 : FROM {buildargs.get('BASE')}")
        self.images[tag] = f"sha256:{next(_ids)}"

    def tag_image(self, ref: str, repo: str, tag: str) -> None:
        self.images[f"{repo}:{tag}"] = self.images[ref]

    def save_images(self, refs: list[str]) -> Iterator[bytes]:
        for r in refs:
            yield f"{r}={self.images[r]}\n".encode()

    def load_images(self, data: IO[bytes] | bytes | Any) -> list[str]:
        self._check()
        if isinstance(data, bytes):
            raw = data
        elif hasattr(data, "read"):
            raw = data.read()
        else:  # an iterable of chunks (a stream fanned out to several engines)
            raw = b"".join(data)
        for line in raw.decode().splitlines():
            ref, iid = line.split("=")
            self.images[ref] = iid
        return ["loaded"]

    def read_image_file(self, ref: str, path: str) -> bytes:
        return b"Package: slurmd\nStatus: install ok installed\nVersion: 24.11.5-4\n"

    # -- test helpers
    def push_log(self, container: str, line: str) -> None:
        """A followed container prints a line."""
        c = self._get(container)
        c.logs += line + "\n"
        for f in self.followers.get(c.spec.name, []):
            f.q.put(line)

    def node(self, cluster: str, node: str) -> FakeContainer:
        return self._get(f"hp-{cluster}-{node}")

    def die(self, cluster: str, node: str, code: int = 137) -> FakeContainer:
        c = self.node(cluster, node)
        c.state, c.exit_code = "exited", code
        return c


def probe_output(
    devices: tuple[str, ...] = (), ldconfig: str = "", bins: tuple[str, ...] = (), listing: tuple[str, ...] = ()
) -> str:
    """What the GPU probe (orchestrator/gpu/inventory.py PROBE_SCRIPT) prints on a host with
    these /dev/nvidia* entries, loader-cache lines, binaries and driver-folder files."""
    parts = ["==machine==", "x86_64", "==devices==", *devices, "==ldconfig==", ldconfig, "==bins==", *bins]
    return "\n".join([*parts, "==listing==", *(f"/host{x}" for x in listing), "==end==", ""])


FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200_XML = (FIXTURES / "gpu-h200" / "nvidia-smi-q.xml").read_text()
H200_UUID = "GPU-3fadaaaa-e57c-b9f1-78a9-3213b39f962c"
DRIVER_LDCONFIG = (
    "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
    "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
    "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1"
)


def h200_xml(n: int = 1) -> str:
    """The real H200's nvidia-smi -q -x, with its <gpu> copied n times: GPU k gets
    minor number k, PCI bus 00:0(6+k).0 and a UUID ending in k (k > 0)."""
    head, rest = H200_XML.split("<gpu id=", 1)
    body, tail = rest.rsplit("</gpu>", 1)
    gpus = []
    for k in range(n):
        g = "<gpu id=" + body + "</gpu>"
        if k:
            g = (
                g.replace("00:00:06.0", f"00:00:{6 + k:02x}.0")
                .replace(H200_UUID, H200_UUID[:-1] + str(k))
                .replace("<minor_number>0</minor_number>", f"<minor_number>{k}</minor_number>")
            )
        gpus.append(g)
    head = head.replace("<attached_gpus>1</attached_gpus>", f"<attached_gpus>{n}</attached_gpus>")
    return head + "\n".join(gpus) + tail


def h200_uuid(k: int) -> str:
    return H200_UUID if k == 0 else H200_UUID[:-1] + str(k)


def gpu_host(p: FakeProvider, n: int = 1, runtime: bool = False) -> None:
    """Make the fake engine's host one with n H200 GPUs (no NVIDIA toolkit unless
    `runtime`): the GPU probe finds their device nodes and the driver in the loader
    cache, and nvidia-smi -q -x in a GPU container prints the real H200's report."""
    devices = tuple(f"/dev/nvidia{k}" for k in range(n)) + (
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    )
    if runtime:
        p.info_ = replace(p.info_, runtimes=("nvidia", "runc"))

    def handler(spec: ContainerSpec) -> ExecResult:
        if spec.command and spec.command[0] == "nvidia-smi":
            return ExecResult(0, h200_xml(n))
        return ExecResult(0, probe_output(devices, DRIVER_LDCONFIG, ("/usr/bin/nvidia-smi",)))

    p.run_handler = handler


READY_LINES = {
    "accounting": "mariadbd: ready for connections.\nslurmdbd version 24.11.5 started",
    "database": "mariadbd: ready for connections.",  # a legacy database container (services/accounting.py)
}


def runs_accounting(c: FakeContainer) -> bool:
    """The controller's container runs slurmdbd and MariaDB when it has slurmdbd.conf."""
    return c.spec.labels.get("io.hp.role") == "controller" and any(
        k.lstrip("/") == "etc/slurm/slurmdbd.conf" for k in c.files
    )


def service_started(p: FakeProvider) -> Callable[[FakeContainer], None]:
    """A container running accounting's daemons says they are ready, as the real ones do
    (its database, then slurmdbd)."""

    def hook(c: FakeContainer) -> None:
        role = "accounting" if runs_accounting(c) else c.spec.labels.get("io.hp.role", "")
        if line := READY_LINES.get(role):
            c.logs += line + "\n"

    return hook


def _match(labels: dict[str, str], cluster: str | None) -> bool:
    return labels.get(L_CLUSTER) == cluster if cluster else labels.get(L_MANAGED) == "1"


class FakeSlurm:
    """One cluster's Slurm, in memory. Shared by every SlurmCli-like handle of the world."""

    def __init__(self) -> None:
        self.up = True
        self.provider: FakeProvider | None = None  # for accounting's default answers
        self.acct_ping: AccountingPing | None = None
        self.acct_jobs: dict[int, AcctJob] = {}
        self.job_states_: dict[tuple[str, str], int] = {}
        self.tokens: list[tuple[str, int]] = []
        self.nodes_: dict[str, SlurmNode] = {}
        self.jobs: dict[int, JobInfo] = {}
        self.auto_register = True
        self.pingable: set[str] = set()  # containers (login nodes) from which slurmctld answers
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.next_job = 1
        self.job_nodes: dict[int, tuple[str, ...]] = {}  # running jobs' nodes (note_jobs)
        self.notes: dict[int, str] = {}  # hp's notes on jobs (AdminComment)
        self.retries: list[AutoResumeRetry] = []  # srun --auto-resume retries slurmctld knows
        self.batch_hosts: dict[int, str] = {}  # running batch jobs' batch hosts (orphan_jobs)
        self.requeued: list[int] = []
        self.no_requeue: set[int] = set()  # jobs Slurm refuses to requeue (--no-requeue)

    def _check(self) -> None:
        if not self.up:
            raise OperationFailed("scontrol: Unable to contact slurm controller (fake)")

    def ping(self) -> bool:
        return self.up

    def ping_from(self, container: str) -> bool:
        return self.up

    def nodes(self) -> list[SlurmNode]:
        self._check()
        return list(self.nodes_.values())

    def node_digest(self) -> str:
        self._check()
        return repr(sorted((n.name, n.state, n.reason) for n in self.nodes_.values()))

    def job(self, job_id: int) -> JobInfo | None:
        self._check()
        return self.jobs.get(job_id)

    def drain(self, nodes: list[str], reason: str) -> None:
        if not nodes:
            return
        self._check()
        self.calls.append(("drain", tuple(nodes)))
        for n in nodes:
            if n not in self.nodes_:
                raise OperationFailed(f"scontrol update nodename={n}: Invalid node name specified")
            sn = self.nodes_[n]
            flags = tuple(f for f in sn.state[1:] if f != "DRAIN") + ("DRAIN",)
            self.nodes_[n] = replace(sn, state=(sn.state[0], *flags), reason=reason)

    def resume(self, nodes: list[str]) -> None:
        if not nodes:
            return
        self._check()
        self.calls.append(("resume", tuple(nodes)))
        for n in nodes:
            sn = self.nodes_[n]
            base = "IDLE" if sn.base == "DOWN" else sn.base
            self.nodes_[n] = replace(sn, state=(base, *[f for f in sn.state[1:] if f not in ("DRAIN", "FAIL")]))

    def down(self, nodes: list[str], reason: str) -> None:
        if not nodes:
            return
        self._check()
        self.calls.append(("down", tuple(nodes)))
        for n in nodes:
            sn = self.nodes_[n]
            self.nodes_[n] = replace(sn, state=("DOWN", *[f for f in sn.state[1:] if f != "DRAIN"]), reason=reason)

    def delete(self, nodes: list[str]) -> None:
        if not nodes:
            return
        self._check()
        self.calls.append(("delete", tuple(nodes)))
        for n in nodes:  # as slurmctld: never a node that holds jobs (running or completing)
            sn = self.nodes_.get(n)
            if sn is not None and (sn.base in ("ALLOCATED", "MIXED") or "COMPLETING" in sn.state):
                raise OperationFailed(f"scontrol delete nodename={n}: Node has jobs or is completing (fake)")
        for n in nodes:
            self.nodes_.pop(n, None)

    def jobs_on(self, node: str) -> list[int]:
        self._check()
        return sorted(j for j in self.jobs if node in self.job_nodes.get(j, ()))

    def note_jobs(self, jobs: list[int], note: str) -> None:
        self._check()
        for j in jobs:
            self.notes[j] = note
        self.calls.append(("note_jobs", tuple(map(str, jobs))))

    def orphan_jobs(self) -> list[OrphanJob]:
        """As slurmctld with --no-kill jobs: a node set DOWN or deleted leaves its jobs,
        the batch host too, and the job runs on."""
        self._check()
        gone = {n for n, sn in self.nodes_.items() if sn.base == "DOWN"}
        return [
            OrphanJob(j, host)
            for j, host in sorted(self.batch_hosts.items())
            if j not in self.requeued and (host in gone or host not in self.nodes_)
        ]

    def requeue(self, job_id: int) -> bool:
        self._check()
        self.calls.append(("requeue", (str(job_id),)))
        if job_id in self.no_requeue:
            return False
        self.requeued.append(job_id)
        return True

    def requeueable(self, job_id: int) -> bool:
        self._check()
        return job_id not in self.no_requeue

    def release_requeued(self, resumed: set[int]) -> list[int]:
        self._check()
        self.calls.append(("release_requeued", tuple(map(str, sorted(resumed)))))
        return list(self.requeued)

    def kill_job(self, job_id: int) -> None:
        self._check()
        self.calls.append(("kill_job", (str(job_id),)))
        self.batch_hosts.pop(job_id, None)

    def auto_resume_retries(self) -> list[AutoResumeRetry]:
        self._check()
        return list(self.retries)

    def reconfigure(self) -> None:
        self._check()
        self.calls.append(("reconfigure", ()))

    def shutdown_controller(self) -> None:
        """slurmctld saves its state and exits: so does its container (hp-entry), until
        a controller container starts again."""
        self._check()
        self.calls.append(("shutdown", ()))
        self.up, self.shut_down = False, True
        for c in self.provider.containers_.values() if self.provider else ():
            if c.spec.labels.get("io.hp.role") == "controller" and c.state == "running":
                c.state = "exited"

    def submit(
        self, container: str, script: str, output: str, args: list[str], user: str, workdir: str, env: dict[str, str]
    ) -> tuple[int | None, str]:
        self._check()
        jid = self.next_job
        self.next_job += 1
        self.jobs[jid] = JobInfo(jid, "COMPLETED", "cpu-1", 0)
        return jid, f"{jid}\n"

    def cancel(self, container: str, job_id: int, user: str) -> None:
        self.calls.append(("cancel", (str(job_id),)))

    def show_node(self, node: str) -> str:
        return f"NodeName={node}\n"

    def overview(self) -> dict[str, str]:
        return {"sinfo.txt": "sinfo\n", "squeue.txt": "squeue\n"}

    def job_states(self) -> dict[tuple[str, str], int]:
        self._check()
        return dict(self.job_states_)

    def accounting_ping(self) -> AccountingPing:
        self._check()
        self.calls.append(("accounting_ping", ()))
        if self.acct_ping is not None:
            return self.acct_ping
        dbd = [
            c
            for c in (self.provider.containers_.values() if self.provider else [])
            if c.spec.labels.get("io.hp.role") == "accounting" or runs_accounting(c)
        ]
        if not any(c.state == "running" for c in dbd):
            return AccountingPing(False, False, True, "")
        return AccountingPing(True, False, False, "slurmdbd answers")

    def sacct(self, job_ids: list[int], container: str | None = None) -> list[AcctJob]:
        self._check()
        return [self.acct_jobs[j] for j in job_ids if j in self.acct_jobs]

    def clusters(self) -> list[str]:
        self._check()
        return ["lab"]

    def token(self, user: str, lifespan: int) -> str:
        self._check()
        self.tokens.append((user, lifespan))
        return "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJocHVzZXIifQ.c2ln"

    # -- what slurmd does when its container starts
    def register(self, c: FakeContainer) -> None:
        if getattr(self, "shut_down", False) and c.spec.labels.get("io.hp.role") == "controller":
            self.up, self.shut_down = True, False  # a controller started after a clean shutdown
        if not self.auto_register or c.spec.labels.get("io.hp.role") != "worker":
            return
        conf = c.spec.environment.get("HP_SLURMD_CONF", "")
        drained = " State=DRAIN" in conf
        reason = conf.split("Reason=", 1)[1] if "Reason=" in conf else ""
        name = c.spec.hostname or ""
        old = self.nodes_.get(name)
        if old is not None and old.drained and not drained:  # a dynamic node's DRAIN survives a restart
            self.nodes_[name] = replace(old, state=("IDLE", "DRAIN"))
            return
        self.nodes_[name] = SlurmNode(name, ("IDLE", "DRAIN") if drained else ("IDLE",), reason)

    def set(self, node: str, *state: str, reason: str = "") -> None:
        self.nodes_[node] = SlurmNode(node, tuple(state), reason)


class FakeAgents:
    def __init__(self) -> None:
        self.ensured: list[str] = []
        self.poked: list[str] = []
        self.stopped: list[str] = []

    def ensure(self, name: str) -> dict:
        self.ensured.append(name)
        return {"Alive": True, "Pid": 1, "Restarted": False}

    def poke(self, name: str) -> None:
        self.poked.append(name)

    def stop(self, name: str) -> None:
        self.stopped.append(name)

    @contextmanager
    def creation_lock(self, name: str) -> Iterator[None]:
        yield


@dataclass
class World:
    env: Env
    provider: FakeProvider
    slurm: FakeSlurm
    agents: FakeAgents
    home: Path


NODE_IMAGE_NAMES = ("controller", "login", "worker", "rest", "check-cpu")


def world(tmp_path: Path, cpus: int = 8, memory_mib: int = 16384, build: bool = True) -> World:
    """An Env on fakes, with a private store; the images built when `build`."""
    p = FakeProvider(cpus, memory_mib)
    slurm = FakeSlurm()
    slurm.provider = p
    p.on_start.append(slurm.register)
    p.on_start.append(service_started(p))
    agents = FakeAgents()
    home = tmp_path / "hphome"
    env = Env(provider=p, store=Store(home), slurm_factory=lambda prov, ctl: slurm, agents=agents)
    p.images[RELEASES[DEFAULT].pulled_base] = "sha256:base"  # the default release's base
    if build:
        env.images(DEFAULT).build(log=lambda s: None)
    return World(env, p, slurm, agents, home)


@dataclass
class MultiWorld:
    env: Env
    provider: Any  # MultiHostProvider
    hosts: dict[str, FakeProvider]
    source: FakeProvider
    slurm: FakeSlurm
    agents: FakeAgents
    home: Path

    def node(self, cluster: str, node: str) -> FakeContainer:
        """The node's running (else any) container, on whatever host holds it."""
        found = []
        for h in self.hosts.values():
            if h.up:
                try:
                    found.append(h.node(cluster, node))
                except ObjectMissing:
                    pass
        if not found:
            raise ObjectMissing(f"no {node}")
        return sorted(found, key=lambda c: c.state != "running")[0]

    def host_of(self, cluster: str, node: str) -> str:
        return self.node(cluster, node).host


def multi_world(tmp_path: Path, hosts: int = 3, cpus: int = 8, memory_mib: int = 16384) -> MultiWorld:
    """An Env over a MultiHostProvider of `hosts` fake engines (h1 the swarm manager)."""
    from orchestrator.docker.multihost import MultiHostProvider

    source = FakeProvider(cpus, memory_mib)
    source.images[RELEASES[DEFAULT].pulled_base] = "sha256:base"
    engines = {f"h{i}": FakeProvider(cpus, memory_mib, name=f"h{i}") for i in range(1, hosts + 1)}
    engines["h1"].info_ = replace(engines["h1"].info_, swarm_manager=True, swarm_state="active")
    slurm = FakeSlurm()
    for e in engines.values():
        e.on_start.append(slurm.register)
        e.on_start.append(service_started(e))
    mp = MultiHostProvider(engines, source)
    agents = FakeAgents()
    home = tmp_path / "hphome"
    env = Env(provider=mp, store=Store(home), slurm_factory=lambda prov, ctl: slurm, agents=agents)
    env.images(DEFAULT).build(log=lambda s: None)
    from orchestrator.docker.images import MULTIHOST_IMAGES

    env.images(DEFAULT).build(MULTIHOST_IMAGES, log=lambda s: None)
    return MultiWorld(env, mp, engines, source, slurm, agents, home)


def spec_doc(name: str, groups: list[tuple[str, str, int]] | None = None, login: bool = True, **top: Any) -> dict:
    igs: list[dict[str, Any]] = [
        {
            "InstanceGroupName": "controller",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Controller"},
        }
    ]
    if login:
        igs.append(
            {
                "InstanceGroupName": "login",
                "InstanceType": "cpu.nano",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            }
        )
    for g, t, n in groups or [("cpu", "cpu.nano", 2)]:
        igs.append(
            {
                "InstanceGroupName": g,
                "InstanceType": t,
                "InstanceCount": n,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": [g]},
            }
        )
    return {"ClusterName": name, "InstanceGroups": igs, **top}


def force_status(store: Store, name: str, status: str, message: str = "") -> None:
    """Record a cluster's status past the gate, as a process that died mid-change (or an
    older hp) could have left it: for tests of those who read it."""
    store.execute("UPDATE clusters SET status=?, message=? WHERE name=?", (status, message, name))
