"""A small provider interface over the container engine (as kind's), on docker-py.

Only this module talks to Docker. It uses the low-level API client: one HTTP call per
operation, no implicit re-inspects, so that hp costs little beyond the floor.
"""
from __future__ import annotations

import io
import os
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import DockerUnavailable, LaunchError, NotFound, OperationFailed
from .naming import L_CLUSTER, L_MANAGED

DOCKER_HELP = (
    "cannot reach a Docker engine{detail}.\n"
    "Start one, then try again:\n"
    "  - Debian/Ubuntu: sudo apt-get install -y docker.io && sudo dockerd &   (or: sudo systemctl start docker)\n"
    "  - macOS/Windows: start Docker Desktop\n"
    "  - or point DOCKER_HOST at a running engine.\n"
    "'make demo' and 'make test' install and start one when none answers."
)


@dataclass
class ContainerSpec:
    name: str
    image: str
    hostname: str
    labels: dict[str, str]
    network: str
    environment: dict[str, str] = field(default_factory=dict)
    volumes: dict[str, str] = field(default_factory=dict)  # volume name -> mount path
    cpu_limit: float | None = None
    memory_mib: int | None = None
    gpus: list[str] = field(default_factory=list)  # host GPU device ids
    command: list[str] | None = None
    privileged: bool = False


@dataclass
class ContainerInfo:
    id: str
    name: str
    labels: dict[str, str]
    state: str  # created, running, exited, dead, restarting, paused, removing
    exit_code: int
    started_at: str
    created: str
    image: str
    ip: str | None


@dataclass
class ExecResult:
    exit_code: int
    output: str


class DockerProvider:
    """Container engine operations hp needs, and nothing more."""

    def __init__(self, base_url: str | None = None, pool_size: int = 64):
        self._base_url = base_url
        self._pool_size = pool_size
        self._api: Any = None
        self._info: dict[str, Any] | None = None

    @property
    def api(self) -> Any:
        if self._api is None:
            import docker  # imported lazily: `hp --help` and spec validation need no engine
            from docker.errors import DockerException

            try:
                if self._base_url:
                    self._api = docker.APIClient(base_url=self._base_url, max_pool_size=self._pool_size, version="auto")
                else:
                    kw = docker.utils.kwargs_from_env()
                    self._api = docker.APIClient(max_pool_size=self._pool_size, version="auto", **kw)
            except DockerException as e:
                detail = f" at {os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')} ({_short(e)})"
                raise DockerUnavailable(DOCKER_HELP.format(detail=detail)) from None
        return self._api

    def info(self) -> dict[str, Any]:
        """The engine's host facts (cores, memory); fetched once per provider."""
        if self._info is None:
            self._info = self.api.info()
        return self._info

    def ping(self) -> None:
        try:
            self.api.ping()
        except DockerUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - any transport error means: no engine
            raise DockerUnavailable(DOCKER_HELP.format(detail=f" ({_short(e)})")) from None

    # -- networks and volumes ---------------------------------------------------------
    def create_network(self, name: str, labels: dict[str, str]) -> str:
        return self.api.create_network(name, driver="bridge", labels=labels, check_duplicate=True)["Id"]

    def remove_network(self, name_or_id: str) -> None:
        _ignore_missing(self.api.remove_network, name_or_id)

    def networks(self, cluster: str | None = None) -> list[dict[str, Any]]:
        return self.api.networks(filters={"label": _label_filter(cluster)})

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        self.api.create_volume(name=name, labels=labels)

    def remove_volume(self, name: str) -> None:
        _ignore_missing(self.api.remove_volume, name, force=True)

    def volumes(self, cluster: str | None = None) -> list[dict[str, Any]]:
        return self.api.volumes(filters={"label": _label_filter(cluster)}).get("Volumes") or []

    # -- containers -------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> str:
        from docker.errors import ImageNotFound

        api = self.api
        host_kw: dict[str, Any] = {
            "init": True,
            "binds": {vol: {"bind": path, "mode": "rw"} for vol, path in spec.volumes.items()},
            "privileged": spec.privileged,
            "network_mode": spec.network,
        }
        if spec.cpu_limit:
            host_kw["nano_cpus"] = int(spec.cpu_limit * 1e9)
        if spec.memory_mib:
            host_kw["mem_limit"] = f"{spec.memory_mib}m"
            host_kw["memswap_limit"] = f"{spec.memory_mib}m"
        if spec.gpus:
            from docker.types import DeviceRequest

            host_kw["device_requests"] = [DeviceRequest(driver="nvidia", device_ids=spec.gpus, capabilities=[["gpu"]])]
        net_cfg = api.create_networking_config({spec.network: api.create_endpoint_config(aliases=[spec.hostname])})
        try:
            res = api.create_container(
                spec.image, command=spec.command, name=spec.name, hostname=spec.hostname,
                labels=spec.labels, environment=spec.environment,
                host_config=api.create_host_config(**host_kw), networking_config=net_cfg,
            )
        except ImageNotFound:
            raise LaunchError("ImageNotFound", f"image {spec.image} is not present on the Docker host; "
                              "build it with 'hp images build'", retryable=False) from None
        return res["Id"]

    def put_files(self, container: str, directory: str, files: dict[str, tuple[bytes, int, int]]) -> None:
        """Copy files (name -> (content, mode, uid)) into a container, created or running."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, (content, mode, uid) in files.items():
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.uid, ti.gid, ti.mtime = len(content), mode, uid, uid, int(time.time())
                tar.addfile(ti, io.BytesIO(content))
        self.api.put_archive(container, directory, buf.getvalue())

    def get_file(self, container: str, path: str) -> bytes:
        stream, _ = self.api.get_archive(container, path)
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            return f.read() if f else b""

    def start(self, container: str) -> None:
        self.api.start(container)

    def restart(self, container: str, timeout: int = 2) -> None:
        self.api.restart(container, timeout=timeout)

    def kill(self, container: str) -> None:
        _ignore_missing(self.api.kill, container)

    def remove_container(self, container: str) -> None:
        _ignore_missing(self.api.remove_container, container, force=True, v=False)

    def containers(self, cluster: str | None = None, extra_labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        flt = [_label_filter(cluster)] + [f"{k}={v}" for k, v in (extra_labels or {}).items()]
        out = []
        for c in self.api.containers(all=True, filters={"label": flt}):
            nets = (c.get("NetworkSettings") or {}).get("Networks") or {}
            ip = next((n.get("IPAddress") for n in nets.values() if n.get("IPAddress")), None)
            out.append(ContainerInfo(
                id=c["Id"], name=c["Names"][0].lstrip("/"), labels=c.get("Labels") or {},
                state=c.get("State", ""), exit_code=_exit_code(c.get("Status", "")),
                started_at="", created=_iso(c.get("Created", 0)), image=c.get("Image", ""), ip=ip,
            ))
        return out

    def inspect(self, container: str) -> dict[str, Any]:
        from docker.errors import NotFound as DNotFound

        try:
            return self.api.inspect_container(container)
        except DNotFound:
            raise NotFound(f"container {container} does not exist") from None

    def logs(self, container: str, tail: int | str = "all") -> str:
        return self.api.logs(container, stdout=True, stderr=True, tail=tail).decode(errors="replace")

    # -- exec -------------------------------------------------------------------------
    def exec(self, container: str, cmd: list[str], *, user: str = "root", workdir: str | None = None,
             environment: dict[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run a command in a container and collect its output (stdout and stderr merged)."""
        from docker.errors import APIError

        api = self.api
        try:
            ex = api.exec_create(container, cmd, user=user, workdir=workdir, environment=environment,
                                 stdin=stdin is not None)
        except APIError as e:  # e.g. 409: the container is not running
            raise OperationFailed(f"cannot run {cmd[0]} in {container}: {e.explanation or e}") from None
        if stdin is None:
            out = api.exec_start(ex["Id"])
        else:
            sock = api.exec_start(ex["Id"], socket=True)
            raw = getattr(sock, "_sock", sock)
            raw.sendall(stdin)
            raw.shutdown(1)  # SHUT_WR: end of input
            out = _read_multiplexed(raw)
        code = api.exec_inspect(ex["Id"])["ExitCode"]
        return ExecResult(code if code is not None else -1, out.decode(errors="replace"))

    def exec_stream(self, container: str, cmd: list[str], *, user: str = "root", workdir: str | None = None,
                    environment: dict[str, str] | None = None) -> tuple[Iterator[tuple[bytes | None, bytes | None]], str]:
        """Start a command; return (iterator of (stdout, stderr) chunks, exec id)."""
        api = self.api
        ex = api.exec_create(container, cmd, user=user, workdir=workdir, environment=environment)
        return api.exec_start(ex["Id"], stream=True, demux=True), ex["Id"]

    def exec_interactive(self, container: str, cmd: list[str], *, user: str = "root", workdir: str | None = None,
                         environment: dict[str, str] | None = None) -> int:
        """Run a command with a terminal attached (for `hp exec NAME -- bash` on a TTY)."""
        import os
        import select
        import shutil
        import sys
        import termios
        import tty

        api = self.api
        ex = api.exec_create(container, cmd, user=user, workdir=workdir, environment=environment, tty=True, stdin=True)
        sock = api.exec_start(ex["Id"], socket=True, tty=True)
        raw = getattr(sock, "_sock", sock)
        size = shutil.get_terminal_size()
        try:
            api.exec_resize(ex["Id"], height=size.lines, width=size.columns)
        except Exception:  # noqa: BLE001 - a terminal size is a nicety
            pass
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        try:
            tty.setraw(fd)
            while True:
                ready, _, _ = select.select([raw, fd], [], [])
                if raw in ready:
                    data = raw.recv(65536)
                    if not data:
                        break
                    os.write(sys.stdout.fileno(), data)
                if fd in ready:
                    data = os.read(fd, 65536)
                    if not data:
                        raw.shutdown(1)
                    else:
                        raw.sendall(data)
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        return self.exec_exit_code(ex["Id"])

    def exec_exit_code(self, exec_id: str) -> int:
        code = self.api.exec_inspect(exec_id)["ExitCode"]
        return code if code is not None else -1

    def events(self, cluster: str | None = None, since: float | None = None) -> Iterator[dict[str, Any]]:
        """Container events (die, start, oom, ...) of hp's containers, as they happen."""
        return self.api.events(decode=True, since=since,
                               filters={"type": "container", "label": [_label_filter(cluster)]})

    # -- images -----------------------------------------------------------------------
    def image_exists(self, ref: str) -> bool:
        from docker.errors import ImageNotFound

        try:
            self.api.inspect_image(ref)
            return True
        except ImageNotFound:
            return False

    def image_id(self, ref: str) -> str | None:
        from docker.errors import ImageNotFound

        try:
            return self.api.inspect_image(ref)["Id"]
        except ImageNotFound:
            return None

    def save_images(self, refs: list[str], chunk_size: int = 4 << 20) -> Iterator[bytes]:
        """One tar of several images, as `docker save a b c`: layers they share are
        stored once (docker-py's get_image takes a single name, hence the raw call)."""
        api = self.api
        res = api._get(api._url("/images/get"), params={"names": refs}, stream=True)
        api._raise_for_status(res)
        return api._stream_raw_result(res, chunk_size, False)

    def load_images(self, data: Any) -> list[str]:
        """Load a tar made by save_images (bytes or a file object); the engine's messages."""
        msgs = []
        for chunk in self.api.load_image(data, quiet=True):
            if "error" in chunk:
                raise LaunchError("ImageLoadFailed", str(chunk["error"]).strip()[:500], retryable=False)
            if chunk.get("stream"):
                msgs.append(chunk["stream"].strip())
        return msgs

    def read_image_file(self, ref: str, path: str) -> bytes:
        """A file from an image, without running it: create a container, copy, remove."""
        cid = self.api.create_container(ref, command=["true"], labels={L_MANAGED: "0"})["Id"]
        try:
            return self.get_file(cid, path)
        finally:
            self.api.remove_container(cid, force=True)

    def get_dir(self, container: str, path: str) -> dict[str, bytes]:
        """Regular files under a directory of a container, running or stopped (relative name -> content)."""
        from docker.errors import NotFound as DNotFound

        try:
            stream, _ = self.api.get_archive(container, path)
        except DNotFound:
            return {}
        out = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            for m in tar:
                f = tar.extractfile(m) if m.isfile() else None
                if f is not None:
                    out[m.name.split("/", 1)[1] if "/" in m.name else m.name] = f.read()
        return out


def _label_filter(cluster: str | None) -> str:
    return f"{L_CLUSTER}={cluster}" if cluster else f"{L_MANAGED}=1"


def _ignore_missing(fn: Any, *a: Any, **kw: Any) -> None:
    from docker.errors import NotFound as DNotFound

    try:
        fn(*a, **kw)
    except DNotFound:
        pass


def _short(e: BaseException) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]


def _exit_code(status: str) -> int:
    # "Exited (137) 3 seconds ago"
    if status.startswith("Exited ("):
        try:
            return int(status[8:status.index(")")])
        except ValueError:
            return -1
    return 0


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _read_multiplexed(sock: Any) -> bytes:
    """Read Docker's multiplexed stream (8-byte frame headers) until EOF."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    out, i = b"", 0
    while i + 8 <= len(data):
        size = int.from_bytes(data[i + 4:i + 8], "big")
        out += data[i + 8:i + 8 + size]
        i += 8 + size
    return out


@dataclass
class CheckContainerSpec:
    """A health-check container that lives in a node's network namespace, with the
    node's cgroup limits (read from the node just before), and nothing more."""

    name: str
    image: str
    node_container: str  # id or name: network_mode container:<it>
    labels: dict[str, str]
    command: list[str]
    nano_cpus: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    memory_bytes: int | None = None
    gpus: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)


def create_check_container(p: DockerProvider, spec: CheckContainerSpec) -> str:
    """Create (not start) a check container. A module-level function over the provider
    (added for the health checks) so the provider class itself stays as it was."""
    api = p.api
    host_kw: dict[str, Any] = {"init": True, "network_mode": f"container:{spec.node_container}"}
    if spec.nano_cpus:
        host_kw["nano_cpus"] = spec.nano_cpus
    elif spec.cpu_quota and spec.cpu_quota > 0:
        host_kw.update(cpu_quota=spec.cpu_quota, cpu_period=spec.cpu_period or 100000)
    if spec.memory_bytes:
        host_kw.update(mem_limit=spec.memory_bytes, memswap_limit=spec.memory_bytes)
    if spec.gpus:
        from docker.types import DeviceRequest

        host_kw["device_requests"] = [DeviceRequest(driver="nvidia", device_ids=spec.gpus, capabilities=[["gpu"]])]
    from docker.errors import ImageNotFound

    try:
        res = api.create_container(spec.image, command=spec.command, name=spec.name, labels=spec.labels,
                                   environment=spec.environment, host_config=api.create_host_config(**host_kw))
    except ImageNotFound:
        raise LaunchError("ImageNotFound", f"check image {spec.image} is not present on the Docker host; "
                          "build it with 'hp images build'", retryable=False) from None
    return res["Id"]
