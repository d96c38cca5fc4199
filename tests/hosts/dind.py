"""Docker "hosts" for hp's multi-host tests and bench: Docker-in-Docker containers, each
running its own dockerd, on one bridge network of the machine's engine (docker-py only).

No --privileged (refused in some sandboxes): every capability but SYS_RESOURCE, seccomp
and AppArmor unconfined, no masked or read-only /proc and /sys paths (what the CLI's
`--security-opt systempaths=unconfined` means), /sys/fs/cgroup bind-mounted read-write,
/dev/fuse (node containers inside mount /home with a FUSE client), and a volume at
/var/lib/docker. Each host's API socket is bind-mounted to the machine
(`unix://<sock root>/<name>/docker.sock`), and each has a fixed address on the hosts'
network (its swarm address).

    hs = Harness(prefix="mh2-").start(3)   # [Host(name, url, ip), ...]
    hs.kill("mh2-host3"); hs.restart("mh2-host3"); hs.stop_all()
    hs.start(1, first=4, fuse=False)       # a host whose engine cannot hand nodes /dev/fuse
    hs.recreate(4)                         # the same host, given the device
    hs.recreate(4, fuse=False, fresh=False)  # loses it again, its images and swarm state kept

Names: every container, volume, network and image it makes starts with `prefix`
(HP_DIND_PREFIX, default "hpdind-"), and carries the label io.hp.dind-harness.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import EndpointConfig
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.waiting_utils import WaitStrategy, WaitStrategyTarget

LABEL = "io.hp.dind-harness"
HERE = Path(__file__).resolve().parent
API_VERSION = "1.41"  # Docker 20.10's


def _context_hash() -> str:
    h = hashlib.sha256()
    for f in sorted((HERE / "image").iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


class EngineAnswers(WaitStrategy):
    """testcontainers wait strategy: ready when the host's own dockerd answers a ping on
    its socket. Its TimeoutError carries the host container's last log lines."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self.with_poll_interval(0.1)

    def wait_until_ready(self, container: WaitStrategyTarget) -> None:
        c = docker.APIClient(base_url=self.url, timeout=2, version=API_VERSION)
        try:
            if not self._poll(c.ping, [docker.errors.DockerException, OSError]):
                logs = container.get_wrapped_container().logs(tail=20).decode(errors="replace")
                raise TimeoutError(
                    f"{self.url}: dockerd did not answer in {self._startup_timeout:g} s; last log:\n{logs}"
                )
        finally:
            c.close()


@dataclass(frozen=True)
class Host:
    name: str
    url: str  # unix:///.../docker.sock
    ip: str  # on the hosts' network: its swarm address


class Unsupported(Exception):
    """This machine's engine cannot run Docker-in-Docker hosts (the reason says why)."""


class Harness:
    def __init__(
        self,
        prefix: str | None = None,
        subnet: str | None = None,
        sock_root: str | None = None,
        base: str | None = None,
    ):
        self.prefix = prefix or os.environ.get("HP_DIND_PREFIX", "hpdind-")
        self.subnet = subnet or os.environ.get("HP_DIND_SUBNET", "100.100.213.0/24")
        self.sock_root = Path(sock_root or os.environ.get("HP_DIND_SOCK_ROOT", "/tmp"))
        self.base = base
        self.network = f"{self.prefix}hosts"
        self.image = f"{self.prefix}dind:{_context_hash()}"  # a changed entry or Dockerfile: a new image
        self._client: Any = None
        self._hosts: dict[str, DockerContainer] = {}
        # testcontainers' Ryuk reaper is an image from a registry, which this machine has none
        # of: off; stop_all (and each test's cleanup) removes what the harness made
        testcontainers_config.ryuk_disabled = True

    # -- the machine's engine ------------------------------------------------------------
    @property
    def docker(self) -> Any:
        if self._client is None:
            self._client = docker.from_env(timeout=300)
        return self._client

    def host_name(self, i: int) -> str:
        return f"{self.prefix}host{i}"

    def host_ip(self, i: int) -> str:
        return self.subnet.split("/")[0].rsplit(".", 1)[0] + f".{10 + i}"

    def url(self, name: str) -> str:
        return f"unix://{self.sock_root / name}/docker.sock"

    def unsupported(self) -> str | None:
        """Why this machine cannot run the hosts (None: it can, as far as can be told before trying)."""
        try:
            self.docker.ping()
        except Exception as e:  # noqa: BLE001 - any failure means: no engine to run hosts on
            return f"no Docker engine answers ({type(e).__name__})"
        if not Path("/sys/fs/cgroup").is_dir():
            return "no /sys/fs/cgroup to give the hosts"
        if not Path("/dev/fuse").exists():
            return "no /dev/fuse: nodes on hosts mount /home with a FUSE client"
        info = self.docker.info()
        if "rootless" in " ".join(info.get("SecurityOptions") or []):
            return "a rootless engine cannot run Docker-in-Docker hosts"
        return None

    def build_image(self, log: Any = print) -> str:
        try:
            self.docker.images.get(self.image)
            return self.image
        except ImageNotFound:
            pass
        base = self.base or next(
            (r for r in ("debian:trixie-slim", "hp-base:trixie") if self._has(r)), "debian:trixie-slim"
        )
        t0 = time.monotonic()
        self.docker.images.build(
            path=str(HERE / "image"),
            tag=self.image,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            labels={LABEL: "1"},
        )
        log(f"built {self.image} in {time.monotonic() - t0:.1f} s")
        return self.image

    def _has(self, ref: str) -> bool:
        try:
            self.docker.images.get(ref)
            return True
        except ImageNotFound:
            return False

    def ensure_network(self) -> None:
        if self.docker.networks.list(names=[self.network]):
            return
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=self.subnet)])
        self.docker.networks.create(self.network, driver="bridge", ipam=ipam, labels={LABEL: "1"}, check_duplicate=True)

    # -- hosts ------------------------------------------------------------------------------
    def wait_engine(self, name: str, timeout: float = 90.0) -> float:
        """Seconds until the host's engine answers (TimeoutError with its log otherwise)."""
        t0 = time.monotonic()
        EngineAnswers(self.url(name)).with_startup_timeout(timeout).wait_until_ready(self._host(name))
        return time.monotonic() - t0

    def _host(self, name: str) -> DockerContainer:
        """The testcontainers handle of a host (one made by another Harness: found by name)."""
        if name not in self._hosts:
            tc = DockerContainer(self.image, name=name)
            tc._container = self.docker.containers.get(name)
            self._hosts[name] = tc
        return self._hosts[name]

    def _start_one(self, i: int, fuse: bool = True, fresh: bool = True) -> Host:
        name = self.host_name(i)
        try:  # a host of this name left by a run that was stopped before its cleanup
            self.docker.api.remove_container(name, force=True, v=True)
        except NotFound:
            pass
        sd = self.sock_root / name
        sd.mkdir(parents=True, exist_ok=True)
        (sd / "docker.sock").unlink(missing_ok=True)
        vol = f"{name}-docker"
        if fresh:  # no engine state (images, a swarm) from an earlier run
            self._remove_volume(vol)
            self.docker.api.create_volume(vol, labels={LABEL: "1"})
        tc = (
            DockerContainer(self.image, name=name)
            .with_volume_mapping("/sys/fs/cgroup", "/sys/fs/cgroup", "rw")
            .with_volume_mapping(vol, "/var/lib/docker", "rw")
            .with_volume_mapping(str(sd), "/hp", "rw")
            .with_kwargs(
                hostname=name,
                labels={LABEL: "1"},
                network=self.network,
                networking_config={
                    self.network: EndpointConfig(API_VERSION, ipv4_address=self.host_ip(i), aliases=[name])
                },
                cap_add=["ALL"],
                cap_drop=["SYS_RESOURCE"],
                security_opt=["seccomp=unconfined", "apparmor=unconfined"],  # systempaths: hp-dind-entry
                devices=["/dev/fuse:/dev/fuse:rwm"] if fuse else [],
                init=True,
            )
            .waiting_for(EngineAnswers(self.url(name)).with_startup_timeout(90))
        )
        tc.tmpfs["/run"] = "rw,exec"
        self._hosts[name] = tc
        tc.start()
        return Host(name, self.url(name), self.host_ip(i))

    def start(self, n: int, first: int = 1, fuse: bool = True) -> list[Host]:
        """Start hosts first..first+n-1 in parallel; Unsupported when this engine cannot.
        `fuse` False: without /dev/fuse (a host whose engine cannot hand it to nodes)."""
        if why := self.unsupported():
            raise Unsupported(why)
        self.build_image()
        self.ensure_network()
        try:
            with ThreadPoolExecutor(max_workers=n) as ex:
                return list(ex.map(lambda i: self._start_one(i, fuse), range(first, first + n)))
        except TimeoutError as e:
            self.stop_all()
            raise Unsupported(f"a Docker-in-Docker host did not start: {e}") from None

    def recreate(self, i: int, fuse: bool = True, fresh: bool = True) -> Host:
        """Host i made again (same name, address and socket), e.g. given /dev/fuse this
        time: a fresh engine, or (`fresh` False) the same engine state, its images and
        swarm membership kept (the machine rebooted without the fuse module)."""
        self._hosts.pop(self.host_name(i), None)
        return self._start_one(i, fuse, fresh)

    def kill(self, name: str) -> None:
        """`docker kill` of the host: its dockerd and every container in it die at once."""
        self.docker.api.kill(name)

    def restart(self, name: str, timeout: float = 90.0) -> float:
        """Start a killed host again; seconds until its engine answers."""
        (self.sock_root / name / "docker.sock").unlink(missing_ok=True)
        t0 = time.monotonic()
        c = self._host(name).get_wrapped_container()
        c.reload()
        if c.status == "running":
            c.restart(timeout=5)
        else:
            c.start()
        self.wait_engine(name, timeout)
        return time.monotonic() - t0

    def exec(self, name: str, cmd: list[str]) -> tuple[int, str]:
        """Run a command in the host container itself (its network namespace: iptables)."""
        r = self.docker.containers.get(name).exec_run(cmd)
        return r.exit_code, r.output.decode(errors="replace")

    def cut_overlay(self, name: str, cut: bool = True) -> None:
        """Drop (or restore) the host's overlay data traffic (VXLAN, UDP 4789) both ways;
        the swarm's control traffic (TCP 2377, 7946) still passes."""
        op = "-I" if cut else "-D"
        for chain, port in (("INPUT", "--dport"), ("OUTPUT", "--dport")):
            code, out = self.exec(name, ["iptables", op, chain, "-p", "udp", port, "4789", "-j", "DROP"])
            if code != 0 and cut:
                raise RuntimeError(f"iptables on {name}: {out}")

    def _remove_volume(self, name: str, timeout: float = 30.0) -> None:
        """Remove a volume, waiting while the container that used it is still going."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.docker.api.remove_volume(name, force=True)
                return
            except NotFound:
                return
            except APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def client(self, name: str) -> Any:
        return docker.DockerClient(base_url=self.url(name), timeout=60)

    def running(self) -> list[str]:
        return sorted(
            c.name for c in self.docker.containers.list(all=True, ignore_removed=True, filters={"label": LABEL})
        )

    def stop_all(self, image: bool = False) -> None:
        """Remove every host of this prefix, its volume and socket folder, the network
        (and with `image`, the host image)."""
        d = self.docker
        cs = [
            c
            for c in d.containers.list(all=True, ignore_removed=True, filters={"label": LABEL})
            if c.name.startswith(self.prefix)
        ]
        with ThreadPoolExecutor(max_workers=max(1, len(cs))) as ex:
            list(ex.map(lambda c: c.remove(force=True, v=True), cs))
        for c in cs:
            shutil.rmtree(self.sock_root / c.name, ignore_errors=True)
        for v in d.volumes.list(filters={"label": LABEL}):
            if v.name.startswith(self.prefix):
                self._remove_volume(v.name)
        for nw in d.networks.list(names=[self.network]):
            try:
                nw.remove()
            except (APIError, NotFound):
                pass
        if image:
            try:
                d.images.remove(self.image, force=True)
            except (ImageNotFound, APIError):
                pass
