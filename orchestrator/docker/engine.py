"""`DockerEngine`: the provider on one Docker engine, through docker-py's low-level API
(one HTTP call per operation, no implicit re-inspects, so that hp costs little beyond
the floor), except the listing of a cluster's containers and execs, the calls of every
command, which go through wire.py (hp's own client of those few calls: docker-py's import alone costs more
than a `docker exec`). The only module that imports docker-py: its exceptions and wire's
become hp's typed errors here (`_errors`, `_wire_errors`), the engine's JSON documents
become the views of views.py.
"""

from __future__ import annotations

import io
import os
import select
import shutil
import sys
import tarfile
import termios
import threading
import time
import tty
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..errors import EngineError, EngineUnavailable, ObjectMissing
from ..naming import (
    L_CLUSTER,
    L_MANAGED,
    L_ROLE,
    LABEL_PREFIX,
    database_volume,
    network_name,
    shared_volume,
    state_volume,
)
from ..naming import labels as hp_labels
from . import wire
from .provider import FileMap, Log
from .views import (
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

DOCKER_HELP = (
    "cannot reach a Docker engine{detail}.\n"
    "Start one, then try again:\n"
    "  - Debian/Ubuntu: sudo apt-get install -y docker.io && sudo dockerd &   (or: sudo systemctl start docker)\n"
    "  - macOS/Windows: start Docker Desktop\n"
    "  - or point DOCKER_HOST at a running engine.\n"
    "'make demo' and 'make test' install and start one when none answers."
)


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """docker-py's exceptions, as hp's typed errors naming what was being done."""
    import requests
    import urllib3
    from docker import errors as de

    try:
        yield
    except (de.NotFound, de.ImageNotFound) as e:
        raise ObjectMissing(f"{what}: {_short(e.explanation or e)}") from None
    except de.APIError as e:
        code = e.response.status_code if e.response is not None else 0
        raise EngineError(f"{what}: {_short(e.explanation or e)}", code) from None
    except (requests.exceptions.ConnectionError, de.DockerException) as e:
        raise EngineUnavailable(DOCKER_HELP.format(detail=f" ({_short(e)})")) from None
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as e:  # a timeout, a broken stream
        raise EngineError(f"{what}: {_short(e)}") from None
    except OSError as e:  # the socket itself (the engine went away mid-call)
        raise EngineUnavailable(DOCKER_HELP.format(detail=f" ({_short(e)})")) from None


@contextmanager
def _wire_errors(what: str) -> Iterator[None]:
    """wire.py's exceptions, as hp's typed errors naming what was being done (as `_errors`
    does docker-py's)."""
    try:
        yield
    except wire.ApiError as e:
        if e.status == 404:
            raise ObjectMissing(f"{what}: {_short(e.message)}") from None
        raise EngineError(f"{what}: {_short(e.message)}", e.status) from None
    except wire.Unreachable as e:
        raise EngineUnavailable(DOCKER_HELP.format(detail=f" ({_short(e)})")) from None
    except wire.Broken as e:  # a timeout, an answer that is not HTTP
        raise EngineError(f"{what}: {_short(e)}") from None


def _speak_the_engines_version(api: Any) -> None:
    """Make docker-py speak the engine's own API version, as its "auto" does, but read it
    from the engine's ping (its API-Version header, which the docker CLI reads too): "auto"
    asks /version, for which the engine gathers every component's version (~10 ms of every
    command; a ping ~1 ms). An answer without the header (an engine older than API 1.25, or
    a proxy that drops it): docker-py's own way. Errors are docker-py's ("auto"'s) own."""
    import docker
    import requests
    import urllib3

    try:
        r = api._get(api._url("/_ping", versioned_api=False))
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
        raise docker.errors.DockerException(f"Error while fetching server API version: {e}") from e
    version = r.headers.get("API-Version") if r.ok else None
    api._version = version or api._retrieve_server_version()
    if docker.utils.version_lt(api._version, docker.constants.MINIMUM_DOCKER_API_VERSION):
        raise docker.errors.InvalidVersion(
            f"the engine's API version {api._version} is below {docker.constants.MINIMUM_DOCKER_API_VERSION}, "
            "the oldest docker-py speaks"
        )


def _not_paused(e: EngineError) -> bool:
    """The engine's answer to unpausing a container that is not frozen (the usual case of
    a blind thaw): Docker 20.10 says 500 "... is not paused" (or, once its cgroup was
    thawed under it, runc's "container not paused"), later engines 409."""
    return e.status == 409 or (e.status == 500 and "not paused" in str(e))


# A container on a named network re-asks ARP for a peer every 50 ms, not every second (the
# kernel's default). A cluster's containers start together and each entry connects to the
# daemon it needs at once (images/node/hp-entry): a peer whose name Docker's DNS already
# answers can miss the first ARP request while its own start is still plumbing its
# interface, and the connect then stalled 1.0 s (seen on slurmdbd's wait for MariaDB in
# most creates: bench/create.py's critical path). Docker >= 26 moves an eth0 sysctl onto
# the container's endpoint.
NEIGHBOUR_SYSCTLS = {"net.ipv4.neigh.eth0.retrans_time_ms": "50"}

# set while this thread runs a thaw helper (DockerEngine._thaw_cgroup): no thaw nests in it
_THAWING = threading.local()


class _Stuck(Exception):
    """The engine did not answer an unpause in time (see DockerEngine.unfreeze)."""


UNPAUSE_TIMEOUT_S = 10.0
# Thaws the freezer cgroup of container $1 (a full ID, never user input), with the host's
# /sys/fs/cgroup at /cg: cgroup v1 (cgroupfs or systemd driver), then v2, then anywhere
# below (an engine nested in a container).
THAW_SCRIPT = r"""
for f in "/cg/freezer/docker/$1/freezer.state" "/cg/freezer/system.slice/docker-$1.scope/freezer.state" \
         $(find /cg/freezer -maxdepth 6 -path "*$1*" -name freezer.state 2>/dev/null); do
  if [ -w "$f" ]; then echo THAWED > "$f" && echo "thawed $f" && exit 0; fi
done
for f in "/cg/docker/$1/cgroup.freeze" "/cg/system.slice/docker-$1.scope/cgroup.freeze" \
         $(find /cg -maxdepth 6 -path "*$1*" -name cgroup.freeze 2>/dev/null); do
  if [ -w "$f" ]; then echo 0 > "$f" && echo "thawed $f" && exit 0; fi
done
echo "no writable freezer cgroup for $1 under /sys/fs/cgroup" >&2
exit 3
"""


def tar_of(files: FileMap) -> bytes:
    """One tar archive of `files` (name -> content, mode, owner's uid and gid), as
    `put_files` copies them into a container in one call."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (content, mode, uid) in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.uid, ti.gid, ti.mtime = len(content), mode, uid, uid, int(time.time())
            tar.addfile(ti, io.BytesIO(content))
    return buf.getvalue()


class DockerEngine:
    """The Provider (provider.py) on one Docker engine.

    `base_url`: unix://, tcp:// (with `tls_dir` holding ca.pem, cert.pem and key.pem for
    TLS) or ssh://user@host (through the system's ssh client); None: DOCKER_HOST or the
    local socket. `cpus` / `memory_mib` replace what the engine reports about its host
    (a registered host's capacity override: Docker-in-Docker test hosts all report the
    whole machine). `timeout`: seconds per API call (docker-py's default 60);
    `answer_timeout`: seconds for the engine's first answer (the ping that names its API
    version, before any call; a registered host's: HP_HOST_PING_TIMEOUT)."""

    def __init__(
        self,
        base_url: str | None = None,
        pool_size: int = 64,
        name: str = LOCAL_ENGINE,
        *,
        timeout: float | None = None,
        cpus: int | None = None,
        memory_mib: int | None = None,
        tls_dir: str | None = None,
        answer_timeout: float | None = None,
    ):
        self._answer_timeout = answer_timeout
        self._base_url = base_url
        self._pool_size = pool_size
        self._timeout = timeout
        self._tls_dir = tls_dir
        self._cpus = cpus
        self._memory_mib = memory_mib
        self._api: Any = None
        self._wire: wire.Endpoint | None = None
        self._info: EngineInfo | None = None
        self.name = name

    @property
    def base_url(self) -> str:
        return self._base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")

    @property
    def api(self) -> Any:
        if self._api is None:
            import docker  # imported lazily: `hp --help` and spec validation need no engine

            where = self.base_url
            # a placeholder, no call: the engine's own version is read next (_speak_the_engines_version)
            kw: dict[str, Any] = {
                "max_pool_size": self._pool_size,
                "version": docker.constants.MINIMUM_DOCKER_API_VERSION,
            }
            if self._answer_timeout or self._timeout:
                kw["timeout"] = self._answer_timeout or self._timeout
            try:
                if self._base_url:
                    if self._base_url.startswith("ssh://"):
                        kw["use_ssh_client"] = True  # the system's ssh (keys, agent, ~/.ssh/config)
                    if self._tls_dir:
                        d = Path(self._tls_dir)
                        kw["tls"] = docker.tls.TLSConfig(
                            client_cert=(str(d / "cert.pem"), str(d / "key.pem")),
                            ca_cert=str(d / "ca.pem"),
                            verify=True,
                        )
                    api = docker.APIClient(base_url=self._base_url, **kw)
                else:
                    api = docker.APIClient(**kw, **docker.utils.kwargs_from_env())
                _speak_the_engines_version(api)
            except docker.errors.DockerException as e:
                raise EngineUnavailable(DOCKER_HELP.format(detail=f" at {where} ({_short(e)})")) from None
            api.timeout = self._timeout or docker.constants.DEFAULT_TIMEOUT_SECONDS  # the calls' own
            self._api = api
        return self._api

    @property
    def wire(self) -> wire.Endpoint:
        """The same engine for listings and execs (wire.py): connects on first use."""
        if self._wire is None:
            kw = {"timeout": self._timeout, "connect_timeout": self._answer_timeout or self._timeout}
            try:
                if self._base_url:
                    tls = wire.Tls.from_dir(self._tls_dir) if self._tls_dir else None
                    self._wire = wire.Endpoint(self._base_url, tls, **kw)
                else:
                    self._wire = wire.Endpoint.from_env(**kw)
            except ValueError as e:
                raise EngineUnavailable(DOCKER_HELP.format(detail=f" ({e})")) from None
        return self._wire

    def ping(self, timeout: float | None = None) -> None:
        """Raise EngineUnavailable unless the engine answers (within `timeout` seconds)."""
        import requests

        with _errors("ping"):
            try:
                if timeout is None:
                    self.api.ping()
                else:
                    api = self.api
                    api._result(api._get(api._url("/_ping"), timeout=timeout))
            except requests.exceptions.Timeout:  # connected, and no answer: as good as none
                raise EngineUnavailable(f"no answer to a ping within {timeout or self._timeout or 60:g} s") from None

    def info(self, refresh: bool = False) -> EngineInfo:
        """The engine's host facts; fetched once per provider (again with `refresh`)."""
        if self._info is None or refresh:
            with _errors("engine info"):
                d = self.api.info()
            swarm = d.get("Swarm") or {}
            self._info = EngineInfo(
                name=d.get("Name", ""),
                server_version=d.get("ServerVersion", ""),
                os=d.get("OperatingSystem", ""),
                arch=d.get("Architecture", ""),
                cpus=self._cpus or int(d.get("NCPU") or os.cpu_count() or 1),
                memory_bytes=self._memory_mib * 2**20 if self._memory_mib else int(d.get("MemTotal") or 0),
                runtimes=tuple(sorted((d.get("Runtimes") or {}).keys())),
                cdi_spec_dirs=tuple(d.get("CDISpecDirs") or ()),
                swarm_state=swarm.get("LocalNodeState", "inactive") or "inactive",
                swarm_node_id=swarm.get("NodeID", "") or "",
                swarm_manager=bool(swarm.get("ControlAvailable")),
                cgroup_version=str(d.get("CgroupVersion", "")),
                swarm_addr=swarm.get("NodeAddr", "") or "",
                swarm_cluster_id=((swarm.get("Cluster") or {}).get("ID", "") or ""),
            )
        return self._info

    # -- the multi-host provider's part: engines, swarm ------------------------------
    def engines(self) -> dict[str, Any]:
        return {LOCAL_ENGINE: self}

    def image_source(self) -> DockerEngine:
        return self

    def unreachable(self, refresh: bool = False) -> dict[str, str]:
        return {}

    def prepare_images(self, refs: list[str], log: Log) -> None:
        """One engine holds its own images: nothing to do."""

    # -- the runtime's part of a cluster (provider.py): one engine, its bridge, its volumes
    places_nodes = False
    reaches_addresses = True

    def cluster_images(self) -> tuple[str, ...]:
        return ()

    def node_image(self, role: str) -> str:
        return role

    def prepare_cluster(self, cluster: str, labels: dict[str, str], encrypted: bool, accounting: bool) -> None:
        prepare_one_engine(self, cluster, labels, encrypted, accounting)

    def place(self, spec: ContainerSpec, cluster: str, role: str, host: str) -> None:
        """One engine: every container is on it, its volumes made by prepare_cluster."""

    def create_overlay(self, name: str, labels: dict[str, str], encrypted: bool = False, mtu: int | None = None) -> str:
        """An attachable overlay network (this engine must be a swarm manager)."""
        opts: dict[str, str] = {}
        if encrypted:
            opts["encrypted"] = "true"
        if mtu:
            opts["com.docker.network.driver.mtu"] = str(mtu)
        with _errors(f"create overlay network {name}"):
            res = self.api.create_network(
                name, driver="overlay", attachable=True, options=opts or None, labels=labels, check_duplicate=True
            )
        return res["Id"]

    def swarm_init(self, advertise_addr: str | None) -> None:
        with _errors("swarm init"):
            self.api.init_swarm(advertise_addr=advertise_addr, listen_addr="0.0.0.0:2377")
        self._info = None

    def swarm_join(self, managers: list[str], token: str, advertise_addr: str | None) -> None:
        with _errors("swarm join"):
            self.api.join_swarm(
                remote_addrs=managers, join_token=token, advertise_addr=advertise_addr, listen_addr="0.0.0.0:2377"
            )
        self._info = None

    def swarm_leave(self) -> None:
        try:
            with _errors("swarm leave"):
                self.api.leave_swarm(force=True)
        except EngineError as e:
            if e.status not in (406, 503):  # not part of a swarm
                raise
        self._info = None

    def swarm_tokens(self) -> dict[str, str]:
        """{'Worker': ..., 'Manager': ...} (on a manager)."""
        with _errors("swarm inspect"):
            return dict(self.api.inspect_swarm().get("JoinTokens") or {})

    def swarm_nodes(self) -> list[dict[str, str]]:
        """The swarm's nodes as a manager sees them: id, hostname, role, state, addr, reachability."""
        with _errors("swarm nodes"):
            raw = self.api.nodes()
        return [
            {
                "id": n["ID"],
                "hostname": (n.get("Description") or {}).get("Hostname", ""),
                "role": (n.get("Spec") or {}).get("Role", ""),
                "availability": (n.get("Spec") or {}).get("Availability", ""),
                "state": (n.get("Status") or {}).get("State", ""),
                "addr": (n.get("Status") or {}).get("Addr", ""),
                "reachability": (n.get("ManagerStatus") or {}).get("Reachability", ""),
                "leader": "1" if (n.get("ManagerStatus") or {}).get("Leader") else "",
            }
            for n in raw
        ]

    def swarm_set_role(self, node_id: str, role: str) -> None:
        """Promote (manager) or demote (worker) a swarm node (on a manager)."""
        with _errors(f"swarm node {node_id[:12]} to {role}"):
            n = self.api.inspect_node(node_id)
            spec = dict(n["Spec"])
            spec["Role"] = role
            self.api.update_node(node_id, n["Version"]["Index"], spec)

    def swarm_remove_node(self, node_id: str) -> None:
        with _ignore_missing(), _errors(f"remove swarm node {node_id[:12]}"):
            self.api.remove_node(node_id, force=True)

    # -- networks and volumes ---------------------------------------------------------
    def create_network(self, name: str, labels: dict[str, str], encrypted: bool = False) -> str:
        if encrypted:  # a bridge stays on one host: there is nothing to encrypt
            raise EngineError(f"create network {name}: an encrypted network needs registered hosts (hp hosts add)")
        with _errors(f"create network {name}"):
            return self.api.create_network(name, driver="bridge", labels=labels, check_duplicate=True)["Id"]

    def remove_network(self, name_or_id: str) -> None:
        with _ignore_missing(), _errors(f"remove network {name_or_id}"):
            self.api.remove_network(name_or_id)

    def networks(self, cluster: str | None = None) -> list[Network]:
        with _errors("list networks"):
            raw = self.api.networks(filters={"label": _label_filter(cluster)})
        return [Network(n["Id"], n["Name"], n.get("Labels") or {}, n.get("Driver", ""), self.name) for n in raw]

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        with _errors(f"create volume {name}"):
            self.api.create_volume(name=name, labels=labels)

    def remove_volume(self, name: str) -> None:
        with _ignore_missing(), _errors(f"remove volume {name}"):
            self.api.remove_volume(name, force=True)

    def volumes(self, cluster: str | None = None) -> list[Volume]:
        with _errors("list volumes"):
            raw = self.api.volumes(filters={"label": _label_filter(cluster)}).get("Volumes") or []
        return [Volume(v["Name"], v.get("Labels") or {}, self.name) for v in raw]

    # -- containers -------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> str:
        with _errors(f"create container {spec.name}"):
            res = self.api.create_container(spec.image, **self.create_args(spec))
        return res["Id"]

    def create_args(self, spec: ContainerSpec) -> dict[str, Any]:
        """docker-py's `create_container` keywords for `spec` (less the image): what a
        container of hp's is made with (bench/floorrun.py makes the floor's with them)."""
        api = self.api
        host_kw: dict[str, Any] = {
            "init": spec.init,
            "binds": {vol: {"bind": path, "mode": "rw"} for vol, path in spec.volumes.items()},
        }
        if spec.network_of:
            host_kw["network_mode"] = f"container:{spec.network_of}"
        elif spec.network == "host":  # a probe of the host's own network (multi-host MTU)
            host_kw["network_mode"] = "host"
        elif spec.network:
            host_kw["network_mode"] = spec.network
        if spec.cpu_limit:
            host_kw["nano_cpus"] = int(spec.cpu_limit * 1e9)
        elif spec.cpu_quota and spec.cpu_quota > 0:
            host_kw.update(cpu_quota=spec.cpu_quota, cpu_period=spec.cpu_period or 100000)
        if spec.memory_bytes:
            host_kw["mem_limit"] = spec.memory_bytes
            host_kw["memswap_limit"] = spec.memory_bytes
        if spec.restart_policy:
            host_kw["restart_policy"] = {"Name": spec.restart_policy}
        if spec.cap_add:
            host_kw["cap_add"] = spec.cap_add
        if spec.security_opt:
            host_kw["security_opt"] = spec.security_opt
        for b in spec.binds:  # "host:container:mode"
            host, ctr, mode = b.rsplit(":", 2)
            host_kw["binds"][host] = {"bind": ctr, "mode": mode}
        devices = list(spec.devices)
        env = dict(spec.environment)
        if spec.gpus:  # the node's GPUs (GpuWiring, orchestrator/gpu/wiring.py)
            from docker.types import DeviceRequest

            devices += spec.gpus.devices
            env.update(spec.gpus.env)
            for b in spec.gpus.binds:  # "host:container:ro"
                host, ctr, mode = b.rsplit(":", 2)
                host_kw["binds"][host] = {"bind": ctr, "mode": mode}
            if spec.gpus.device_requests:
                host_kw["device_requests"] = [DeviceRequest(**dict(r)) for r in spec.gpus.device_requests]
        if devices:
            host_kw["devices"] = devices
        net_cfg = None
        if spec.network and spec.network not in ("none", "host") and not spec.network_of:
            aliases = [spec.hostname] if spec.hostname else None
            net_cfg = api.create_networking_config({spec.network: api.create_endpoint_config(aliases=aliases)})
            host_kw["sysctls"] = NEIGHBOUR_SYSCTLS
        return {
            "command": spec.command,
            "entrypoint": spec.entrypoint,
            "name": spec.name,
            "hostname": spec.hostname if not spec.network_of and spec.network != "host" else None,
            "labels": spec.labels,
            "environment": env,
            "host_config": api.create_host_config(**host_kw),
            "networking_config": net_cfg,
        }

    def put_files(self, container: str, directory: str, files: FileMap) -> None:
        with _errors(f"copy files into {container}:{directory}"):
            self.api.put_archive(container, directory, tar_of(files))

    def get_file(self, container: str, path: str) -> bytes:
        with _errors(f"read {container}:{path}"):
            stream, _ = self.api.get_archive(container, path)
            data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            return f.read() if f else b""

    def get_dir(self, container: str, path: str) -> dict[str, bytes]:
        try:
            with _errors(f"read {container}:{path}"):
                stream, _ = self.api.get_archive(container, path)
                data = b"".join(stream)
        except ObjectMissing:
            return {}
        out = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar:
                f = tar.extractfile(m) if m.isfile() else None
                if f is not None:
                    out[m.name.split("/", 1)[1] if "/" in m.name else m.name] = f.read()
        return out

    def start(self, container: str) -> None:
        with _errors(f"start {container}"):
            self.api.start(container)

    def restart(self, container: str, timeout: int = 2) -> None:
        """Restart; a frozen container (docker pause, or a cgroup left frozen by an engine
        that stopped mid-kill) is thawed first (`unfreeze`), so that its processes can stop."""
        self.unfreeze(container)
        with _errors(f"restart {container}"):
            self.api.restart(container, timeout=timeout)

    def unfreeze(self, container: str) -> bool:
        """Thaw a frozen container; True if it was frozen.

        Tried blind, never after an inspect. Docker 20.10 holds a container's exec lock
        while an exec starts, and an exec that began as the container froze never finishes
        starting (its `runc init` froze too): every inspect, unpause and forced remove of
        that container then waits for good (seen with `docker pause` during hp's own
        `scontrol` execs). When the engine's unpause does not answer within
        UNPAUSE_TIMEOUT_S, the container's freezer cgroup is thawed from a short-lived
        helper container (its own image, no network, the host's cgroup tree mounted), which
        lets the stuck exec finish; the engine answers again."""
        try:
            self._unpause(container)
            return True
        except _Stuck:
            pass
        except EngineError as e:
            if _not_paused(e):
                return False
            raise
        self._thaw_cgroup(container)
        try:
            self._unpause(container)
        except EngineError as e:  # thawed under the engine: runc says "not paused"
            if not _not_paused(e):
                raise
        return True

    def _unpause(self, container: str) -> None:
        import requests

        api = self.api
        with _errors(f"unpause {container}"):
            try:
                res = api._post(api._url("/containers/{0}/unpause", container), timeout=UNPAUSE_TIMEOUT_S)
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as e:
                # over a unix socket docker-py reports a read timeout as a ConnectionError
                if isinstance(e, requests.exceptions.ReadTimeout) or "timed out" in str(e).lower():
                    raise _Stuck(container) from None
                raise
            api._raise_for_status(res)

    def _thaw_cgroup(self, container: str) -> None:
        """One helper container, never nested: the helper itself is removed without a thaw
        (a slow engine times out its removal too, and a thaw of the helper would start
        another helper, and so on: a CI run once left 306 of them, the engine wedged)."""
        if getattr(_THAWING, "active", False):
            raise EngineError(f"unpause {container}: the engine does not answer (not thawed: a thaw is under way)")
        with _errors(f"find {container}"):
            found = [
                c
                for flt in ({"id": container}, {"name": container})
                for c in self.api.containers(all=True, filters=flt)
                if c["Id"].startswith(container) or f"/{container}" in c.get("Names", [])
            ]
        if not found:
            raise ObjectMissing(f"unpause {container}: no such container")
        cid, image = found[0]["Id"], found[0]["Image"]
        if (found[0].get("Labels") or {}).get(L_ROLE) == "thaw":
            raise EngineError(f"unpause {container}: a thaw helper is never thawed itself")
        _THAWING.active = True
        try:
            r = self._run_thaw(cid, image)
        finally:
            _THAWING.active = False
        if r.exit_code != 0:
            raise EngineError(
                f"unpause {container}: the engine does not answer (an exec stuck in the frozen container) "
                f"and its freezer cgroup could not be thawed: {r.output.strip()[-300:]}"
            )

    def _run_thaw(self, cid: str, image: str) -> ExecResult:
        return self.run_once(
            ContainerSpec(
                name=f"hp-thaw-{cid[:12]}",
                image=image,
                labels={L_MANAGED: "1", L_ROLE: "thaw"},
                network="none",
                binds=["/sys/fs/cgroup:/cg:rw"],
                entrypoint=["sh", "-c", THAW_SCRIPT, "thaw", cid],
                init=False,
            ),
            timeout=60,
        )

    def kill(self, container: str) -> None:
        try:
            with _errors(f"kill {container}"):
                self.api.kill(container)
        except EngineError as e:
            if e.status not in (404, 409):  # gone, or not running: nothing to kill
                raise

    def remove_container(self, container: str) -> None:
        try:
            with _ignore_missing(), _errors(f"remove {container}"):
                self.api.remove_container(container, force=True, v=False)
        except EngineError as e:
            if "timed out" not in str(e).lower() or getattr(_THAWING, "active", False):
                raise
            self.unfreeze(container)  # wedged frozen (see unfreeze): answers nothing until thawed
            with _ignore_missing(), _errors(f"remove {container}"):
                self.api.remove_container(container, force=True, v=False)

    def containers(self, cluster: str | None = None, extra_labels: dict[str, str] | None = None) -> list[Container]:
        extra = extra_labels or {}
        flt = [_label_filter(cluster)] if cluster or L_MANAGED not in extra else []
        flt += [f"{k}={v}" for k, v in extra.items()]
        with _wire_errors("list containers"):
            raw = self.wire.containers({"label": flt})
        out = []
        for c in raw:
            nets = (c.get("NetworkSettings") or {}).get("Networks") or {}
            ip = next((n.get("IPAddress") for n in nets.values() if n.get("IPAddress")), None)
            out.append(
                Container(
                    id=c["Id"],
                    name=c["Names"][0].lstrip("/"),
                    labels=c.get("Labels") or {},
                    state=c.get("State", ""),
                    exit_code=_exit_code(c.get("Status", "")),
                    created=_iso(c.get("Created", 0)),
                    image=c.get("Image", ""),
                    ip=ip,
                    host=self.name,
                    image_id=c.get("ImageID", ""),
                )
            )
        return out

    def inspect(self, container: str) -> ContainerDetails:
        with _errors(f"inspect {container}"):
            d = self.api.inspect_container(container)
        st, hc = d.get("State") or {}, d.get("HostConfig") or {}
        return ContainerDetails(
            id=d["Id"],
            name=d.get("Name", "").lstrip("/"),
            image=(d.get("Config") or {}).get("Image", ""),
            labels=(d.get("Config") or {}).get("Labels") or {},
            state=ContainerState(
                status=st.get("Status", ""),
                running=bool(st.get("Running")),
                exit_code=int(st.get("ExitCode") or 0),
                oom_killed=bool(st.get("OOMKilled")),
                started_at=st.get("StartedAt", ""),
                finished_at=st.get("FinishedAt", ""),
                error=st.get("Error", ""),
            ),
            limits=Limits(
                nano_cpus=int(hc.get("NanoCpus") or 0),
                cpu_quota=int(hc.get("CpuQuota") or 0),
                cpu_period=int(hc.get("CpuPeriod") or 0),
                memory_bytes=int(hc.get("Memory") or 0),
            ),
            host=self.name,
            addresses=_addresses((d.get("NetworkSettings") or {}).get("Networks") or {}),
        )

    def logs(self, container: str, tail: int | str = "all") -> str:
        with _errors(f"logs of {container}"):
            return self.api.logs(container, stdout=True, stderr=True, tail=tail).decode(errors="replace")

    def follow_logs(self, container: str, since: float | None = None) -> _Lines:
        with _errors(f"follow the logs of {container}"):
            raw = self.api.logs(container, stdout=True, stderr=True, stream=True, follow=True, since=since or None)
        return _Lines(raw, container)

    def run_once(self, spec: ContainerSpec, timeout: float = 120.0) -> ExecResult:
        import requests

        cid = self.create_container(spec)
        try:
            self.start(cid)
            with _errors(f"wait for {spec.name}"):
                try:
                    code = self.api.wait(cid, timeout=timeout).get("StatusCode", -1)
                except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as e:
                    # over a unix socket docker-py reports a read timeout as a ConnectionError
                    if not isinstance(e, requests.exceptions.ReadTimeout) and "timed out" not in str(e).lower():
                        raise
                    raise EngineError(f"{spec.name} did not finish within {timeout:g} s", 408) from None
            return ExecResult(int(code), self.logs(cid))
        finally:
            self.remove_container(cid)

    # -- exec (wire.py) --------------------------------------------------------------
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
        w = self.wire
        with _wire_errors(f"run {cmd[0]} in {container}"):
            eid = w.exec_create(container, cmd, user, workdir, environment, stdin=stdin is not None)
            conn = w.exec_start(eid)
            try:
                if stdin is not None:
                    conn.send(stdin)
                    conn.end_input()
                out = b"".join(o or e or b"" for o, e in conn.frames())
            finally:
                conn.close()
            code = w.exec_exit_code(eid)
        return ExecResult(code, out.decode(errors="replace"))

    def exec_stream(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecHandle:
        w = self.wire
        with _wire_errors(f"run {cmd[0]} in {container}"):
            eid = w.exec_create(container, cmd, user, workdir, environment)
            conn = w.exec_start(eid)
        return ExecHandle(_chunks(conn, f"output of {cmd[0]} in {container}"), eid)

    def exec_exit_code(self, handle: ExecHandle) -> int:
        with _wire_errors("exec status"):
            return self.wire.exec_exit_code(handle.id)

    def exec_interactive(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> int:  # pragma: no cover - needs a terminal; exercised by hand (hp exec lab -- bash)
        w = self.wire
        with _wire_errors(f"run {cmd[0]} in {container}"):
            eid = w.exec_create(container, cmd, user, workdir, environment, stdin=True, tty=True)
            conn = w.exec_start(eid, tty=True)
            size = shutil.get_terminal_size()
            w.exec_resize(eid, size.lines, size.columns)
        raw = conn.sock
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        watched: list[Any] = [raw, fd]
        try:
            tty.setraw(fd)
            os.write(sys.stdout.fileno(), conn.held())  # what came with the headers (a prompt)
            while True:
                ready, _, _ = select.select(watched, [], [])
                if raw in ready:
                    data = raw.recv(65536)
                    if not data:
                        break
                    os.write(sys.stdout.fileno(), data)
                if fd in ready:
                    data = os.read(fd, 65536)
                    if not data:  # end of input: the command's too; its output may go on
                        conn.end_input()
                        watched.remove(fd)
                    else:
                        conn.send(data)
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            conn.close()
        return self.exec_exit_code(ExecHandle(iter(()), eid))

    def events(self, cluster: str | None = None) -> _Events:
        with _errors("event stream"):
            raw = self.api.events(decode=True, filters={"type": "container", "label": [_label_filter(cluster)]})
        return _Events(raw, self.name)

    # -- images -----------------------------------------------------------------------
    def image_id(self, ref: str) -> str | None:
        try:
            with _errors(f"inspect image {ref}"):
                return self.api.inspect_image(ref)["Id"]
        except ObjectMissing:
            return None

    def pull(self, repo: str, tag: str) -> None:
        with _errors(f"pull {repo}:{tag}"):
            self.api.pull(repo, tag=tag)

    def import_image(self, tar_path: Path, repo: str, tag: str, changes: list[str]) -> None:
        with _errors(f"import {repo}:{tag}"):
            self.api.import_image_from_file(str(tar_path), repository=repo, tag=tag, changes=changes)

    def build_image(self, context: Path, tag: str, target: str | None, buildargs: dict[str, str], log: Log) -> None:
        tail: list[str] = []
        with _errors(f"build {tag}"):
            for chunk in self.api.build(
                path=str(context), tag=tag, target=target, buildargs=buildargs, rm=True, forcerm=True, decode=True
            ):
                if "stream" in chunk:
                    line = chunk["stream"].rstrip()
                    if line:
                        tail = (tail + [line])[-30:]
                        log(line)
                if "error" in chunk:
                    raise EngineError(f"building {tag} failed: {chunk['error'].strip()}\n" + "\n".join(tail[-15:]))

    def tag_image(self, ref: str, repo: str, tag: str) -> None:
        with _errors(f"tag {ref}"):
            self.api.tag(ref, repo, tag)

    def save_images(self, refs: list[str], chunk_size: int = 4 << 20) -> Iterator[bytes]:
        """One tar of several images, as `docker save a b c` (docker-py's get_image takes
        a single name, hence the raw call)."""
        api = self.api
        with _errors("save images"):
            res = api._get(api._url("/images/get"), params={"names": refs}, stream=True)
            api._raise_for_status(res)
            yield from api._stream_raw_result(res, chunk_size, False)

    def load_images(self, data: IO[bytes] | bytes | Iterable[bytes]) -> list[str]:
        msgs = []
        with _errors("load images"):
            for chunk in self.api.load_image(data, quiet=True):
                if "error" in chunk:
                    raise EngineError(f"loading images failed: {str(chunk['error']).strip()[:500]}")
                if chunk.get("stream"):
                    msgs.append(chunk["stream"].strip())
        return msgs

    def read_image_file(self, ref: str, path: str) -> bytes:
        with _errors(f"read {path} of image {ref}"):
            cid = self.api.create_container(ref, command=["true"], labels={L_MANAGED: "0"})["Id"]
        try:
            return self.get_file(cid, path)
        finally:
            self.remove_container(cid)


def prepare_one_engine(p: Any, cluster: str, labels: dict[str, str], encrypted: bool, accounting: bool) -> None:
    """A cluster on one engine (DockerEngine's prepare_cluster, and the unit tests'
    fake's): its bridge network, then its volumes (the controller's state, the shared
    /home, with Accounting the database's)."""
    p.create_network(network_name(cluster), {**hp_labels(cluster, "network"), **labels}, encrypted=encrypted)
    p.create_volume(state_volume(cluster), hp_labels(cluster, "state"))
    p.create_volume(shared_volume(cluster), hp_labels(cluster, "shared"))
    if accounting:
        p.create_volume(database_volume(cluster), hp_labels(cluster, "database"))


class _Events:
    """A closable iterator of Event views over docker-py's decoded event stream."""

    def __init__(self, raw: Any, host: str):
        self._raw = raw
        self._host = host

    def __iter__(self) -> Iterator[Event]:
        with _errors("event stream"):
            for ev in self._raw:
                attrs = (ev.get("Actor") or {}).get("Attributes") or {}
                code = attrs.get("exitCode")
                t = ev.get("timeNano", 0) / 1e9 or float(ev.get("time", 0) or time.time())
                yield Event(
                    action=ev.get("Action") or ev.get("status") or "",
                    container=ev.get("id") or (ev.get("Actor") or {}).get("ID", ""),
                    labels={k: v for k, v in attrs.items() if k.startswith(f"{LABEL_PREFIX}.")},
                    time=t,
                    exit_code=int(code) if code and code.lstrip("-").isdigit() else None,
                    host=self._host,
                )

    def close(self) -> None:
        close = getattr(self._raw, "close", None)
        if close is not None:
            close()


class _Lines:
    """A closable iterator of a container's output lines over docker-py's log stream
    (frames are not lines: they are joined and split here)."""

    def __init__(self, raw: Any, container: str):
        self._raw = raw
        self._container = container

    def __iter__(self) -> Iterator[str]:
        buf = b""
        with _errors(f"logs of {self._container}"):
            for chunk in self._raw:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
        if buf:
            yield buf.decode(errors="replace")

    def close(self) -> None:
        close = getattr(self._raw, "close", None)
        if close is not None:
            close()


@contextmanager
def _ignore_missing() -> Iterator[None]:
    try:
        yield
    except ObjectMissing:
        pass


def _label_filter(cluster: str | None) -> str:
    return f"{L_CLUSTER}={cluster}" if cluster else f"{L_MANAGED}=1"


def _addresses(networks: dict[str, Any]) -> dict[str, str]:
    """NetworkSettings.Networks ({"hp-lab": {"IPAddress": "172.18.0.5", ...}}): network ->
    IPv4 address (a stopped container has none)."""
    return {str(n): str(v.get("IPAddress")) for n, v in networks.items() if isinstance(v, dict) and v.get("IPAddress")}


def _short(e: object) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:300]


def _exit_code(status: str) -> int:
    # "Exited (137) 3 seconds ago"
    if status.startswith("Exited ("):
        try:
            return int(status[8 : status.index(")")])
        except ValueError:
            return -1
    return 0


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _chunks(conn: wire.Conn, what: str) -> Iterator[tuple[bytes | None, bytes | None]]:
    """An exec's demultiplexed output (wire's frames), its connection closed at the end or
    when the reader stops early; the stream breaking is EngineUnavailable."""
    frames = conn.frames()
    try:
        with _wire_errors(what):
            yield from frames
    finally:
        frames.close()
