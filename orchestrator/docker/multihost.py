"""`MultiHostProvider`: the Provider (provider.py) over several Docker engines, one per
registered host (`hp hosts add`), joined in a Docker swarm. The second implementation of
the Protocol, next to `DockerEngine` (one engine); hp uses it when hosts are registered.

- Routing. A call on a container goes to the engine that holds it: ids and names are
  remembered from every listing and creation; an unknown one is looked up on every
  reachable engine (a running container wins over a stopped one of the same name: a
  host that came back may still hold a stale copy until hp removes it). A new
  container goes to `ContainerSpec.host` (chosen by the Launcher's placement), a check
  container to its node's host (`network_of`).
- Lists (containers, networks, volumes) are the union over reachable engines, each
  view naming its `host`; events are merged from every engine (a thread per engine,
  reconnecting while the engine is away).
- Networks are attachable swarm overlays, created on a manager (`--encrypt-network`:
  IPsec between hosts; hp proves that traffic passes before using one).
- Images are built on the local engine (the image source) and made present on a host
  by image id before a node is placed there: one `docker save` fanned out to every host
  that lacks one (with progress), or, with HP_REGISTRY, pulled from that registry.
- Reachability. Before the first call on any host, every host is pinged at once
  (HP_HOST_PING_TIMEOUT each, 2 s: a host that does not answer costs a command at most
  that, never docker-py's 60 s per call); a host named in `lost` (the host watcher saw
  it not answering moments ago) is not even pinged. A host whose engine fails a call (or
  a ping) is unreachable: it is skipped by lists (`unreachable()` says which and why)
  and tried again at most every RETRY_S (a `lost` one: after LOST_RETRY_S). Calls aimed
  at it raise EngineUnavailable naming it.

Never a restart policy: a host that comes back must not revive a stale copy of a node
that was replaced elsewhere (hp removes those before anything starts).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import EngineError, EngineUnavailable, ObjectMissing
from ..naming import L_HOST, database_volume, fileserver_name, network_name, state_volume
from ..naming import labels as hp_labels
from .provider import FileMap, Log, Provider
from .views import (
    Container,
    ContainerDetails,
    ContainerSpec,
    EngineInfo,
    Event,
    ExecHandle,
    ExecResult,
    LineStream,
    Network,
    Volume,
)

log = logging.getLogger("hp.hosts")
T = TypeVar("T")

# an unreachable host is tried again at most this often by a call aimed at it: longer than a
# command (a command pays one ping timeout for a dead host, not one per RETRY_S of its run);
# the agent's host watch pings every host each second, so a host back is seen at once there
RETRY_S = 15.0
LOST_RETRY_S = 30.0  # ... and one the host watcher said is lost (longer than a command)
PING_TIMEOUT_S = float(os.environ.get("HP_HOST_PING_TIMEOUT", "2"))
FANOUT_DEPTH = 16  # chunks queued per destination of a fanned-out image stream
PROGRESS_EVERY = 64 << 20


class HostUnavailable(EngineUnavailable):
    """A registered host's engine does not answer."""

    def __init__(self, host: str, why: str):
        self.host = host
        super().__init__(f"host {host} does not answer: {why}")


def _why(e: BaseException) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]


class MultiHostProvider:
    """The Provider over the engines of registered hosts (`engines`: host name -> engine,
    in the hosts' order), with images from `source` (the local engine)."""

    def __init__(
        self,
        engines: dict[str, Any],
        source: Provider,
        *,
        mtu: int | None = None,
        registry: str | None = None,
        lost: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not engines:
            raise ValueError("a multi-host provider needs at least one host")
        self._engines: dict[str, Any] = dict(engines)
        self.source = source
        self.mtu = mtu
        self.registry = registry if registry is not None else (os.environ.get("HP_REGISTRY") or None)
        self.clock = clock
        self._lock = threading.RLock()
        self._down: dict[str, tuple[float, str]] = {}  # host -> (next try, why)
        for h, why in (lost or {}).items():
            if h in self._engines:
                self._down[h] = (clock() + LOST_RETRY_S, why)
        self._checked = False  # every host pinged once (before the first call on any)
        self._first = threading.Lock()
        self._where: dict[str, str] = {}  # container id / name -> host
        self._execs: dict[str, str] = {}  # exec id -> host
        self._image_locks: dict[str, threading.Lock] = {h: threading.Lock() for h in engines}

    # -- hosts ------------------------------------------------------------------------
    def image_source(self) -> Any:
        return self.source

    def engines(self) -> dict[str, Any]:
        return dict(self._engines)

    def engine(self, host: str) -> Any:
        try:
            return self._engines[host]
        except KeyError:
            raise EngineError(f"no registered host named {host!r} (hp hosts list)", 404) from None

    def unreachable(self, refresh: bool = False) -> dict[str, str]:
        if refresh:
            self.check()
        else:
            self._first_check()
        with self._lock:
            return {h: why for h, (_, why) in self._down.items()}

    def _first_check(self) -> None:
        """Once per provider: ping the hosts not already known lost, all at once."""
        if self._checked:
            return
        with self._first:  # the other threads wait for it: none calls a host unchecked
            if not self._checked:
                with self._lock:
                    hosts = [h for h in self._engines if h not in self._down]
                self.check(hosts)

    def check(self, hosts: Iterable[str] | None = None) -> dict[str, str]:
        """Ping every host (or those given) now, in parallel, PING_TIMEOUT_S each; the
        unreachable ones -> why."""
        res: dict[str, str | None] = {}

        def one(host: str) -> None:
            try:
                self._engines[host].ping(timeout=PING_TIMEOUT_S)
                res[host] = None
            except EngineUnavailable as e:
                res[host] = _why(e)
            except EngineError as e:  # it answered, with an error: reachable
                log.info("ping of %s: %s", host, e)
                res[host] = None

        todo = list(self._engines if hosts is None else hosts)
        threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in todo]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        now = self.clock()
        with self._lock:
            for h, why in res.items():
                if why is None:
                    self._down.pop(h, None)
                else:
                    self._down[h] = (now + RETRY_S, why)
            self._checked = True
            return {h: why for h, (_, why) in self._down.items()}

    def _mark_down(self, host: str, why: str) -> None:
        with self._lock:
            if host not in self._down:  # said by unreachable(), hp hosts list and node messages
                log.info("host %s does not answer: %s", host, why)
            self._down[host] = (self.clock() + RETRY_S, why)

    def _is_down(self, host: str) -> bool:
        """Down, and not due for another try (a due one is pinged here)."""
        self._first_check()
        with self._lock:
            d = self._down.get(host)
        if d is None:
            return False
        if self.clock() < d[0]:
            return True
        try:
            self._engines[host].ping(timeout=PING_TIMEOUT_S)
        except EngineUnavailable as e:
            self._mark_down(host, _why(e))
            return True
        except EngineError:
            pass
        with self._lock:
            self._down.pop(host, None)
        log.info("host %s answers again", host)
        return False

    def live(self) -> list[str]:
        """Hosts that answer (or are due for another try), in order."""
        return [h for h in self._engines if not self._is_down(h)]

    def _call(self, host: str, fn: Callable[[Any], T]) -> T:
        if self._is_down(host):
            raise HostUnavailable(host, self._down.get(host, (0, "unreachable"))[1])
        try:
            return fn(self._engines[host])
        except HostUnavailable:
            raise
        except EngineUnavailable as e:
            self._mark_down(host, _why(e))
            raise HostUnavailable(host, _why(e)) from None

    def _each(self, fn: Callable[[str, Any], T]) -> list[tuple[str, T]]:
        """fn on every live host (in parallel); hosts that fail are marked and skipped."""
        hosts = self.live()
        out: dict[str, T] = {}

        def one(h: str) -> None:
            try:
                out[h] = fn(h, self._engines[h])
            except EngineUnavailable as e:
                self._mark_down(h, _why(e))

        if len(hosts) == 1:
            one(hosts[0])
        else:
            threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return [(h, out[h]) for h in hosts if h in out]

    # -- the engine -------------------------------------------------------------------
    def ping(self, timeout: float | None = None) -> None:
        """Fine when one host answers; hosts that do not are named by unreachable()."""
        for h in self.live():
            try:
                self._call(h, lambda e: e.ping(timeout=timeout or PING_TIMEOUT_S))
                return
            except EngineUnavailable:
                continue
        down = "; ".join(f"{h}: {why}" for h, why in self.unreachable().items())
        raise EngineUnavailable(f"no registered host answers ({down}); see 'hp hosts list'")

    def info(self) -> EngineInfo:
        """The hosts together: their CPUs and memory summed (per-host facts: engines())."""
        infos = [i for _, i in self._each(lambda h, e: e.info())]
        if not infos:
            self.ping()
        first = infos[0]
        return EngineInfo(
            name="hosts:" + ",".join(self._engines),
            server_version=first.server_version,
            os=first.os,
            arch=first.arch,
            cpus=sum(i.cpus for i in infos),
            memory_bytes=sum(i.memory_bytes for i in infos),
            runtimes=first.runtimes,
            swarm_state=first.swarm_state,
            swarm_manager=any(i.swarm_manager for i in infos),
            cgroup_version=first.cgroup_version,
        )

    # -- networks and volumes -----------------------------------------------------------
    def _manager(self) -> str:
        for h in self.live():
            try:
                if self._call(h, lambda e: e.info()).swarm_manager:
                    return h
            except EngineUnavailable:
                continue
        raise EngineUnavailable("no swarm manager among the reachable hosts answers (hp hosts list)")

    # -- the runtime's part of a cluster (provider.py): placed nodes, an overlay, /home served
    places_nodes = True
    reaches_addresses = False  # the overlay's addresses are not routed to this machine

    def cluster_images(self) -> tuple[str, ...]:
        return ("node-mh", "fileserver")

    def node_image(self, role: str) -> str:
        return role if role == "controller" else "node-mh"  # login and compute: /home from the file server

    def prepare_cluster(self, cluster: str, labels: dict[str, str], encrypted: bool, accounting: bool) -> None:
        """The overlay only: each volume is made on the host of the container that mounts
        it (place), the shared /home by the file server's (core/across_hosts.py)."""
        self.create_network(network_name(cluster), {**hp_labels(cluster, "network"), **labels}, encrypted=encrypted)

    def place(self, spec: ContainerSpec, cluster: str, role: str, host: str) -> None:
        spec.host = host
        spec.labels[L_HOST] = host
        if role == "controller":  # its volumes (state, the database's) made on its host
            kinds = {state_volume(cluster): "state", database_volume(cluster): "database"}
            spec.volume_labels = {v: hp_labels(cluster, kinds[v]) for v in spec.volumes if v in kinds}
        elif role in ("login", "worker"):  # /home from the cluster's file server, over the overlay
            spec.volumes = {}
            spec.environment["HP_HOME_SERVER"] = fileserver_name(cluster)
            spec.devices = ["/dev/fuse:/dev/fuse:rwm"]
            spec.cap_add = ["SYS_ADMIN"]
            spec.security_opt = ["apparmor=unconfined"]  # docker-default denies mount(2)

    def create_network(self, name: str, labels: dict[str, str], encrypted: bool = False) -> str:
        host = self._manager()
        return self._call(host, lambda e: e.create_overlay(name, labels, encrypted, self.mtu))

    def remove_network(self, name_or_id: str) -> None:
        try:
            host = self._manager()
        except EngineUnavailable:
            return
        self._call(host, lambda e: e.remove_network(name_or_id))

    def networks(self, cluster: str | None = None) -> list[Network]:
        seen: dict[str, Network] = {}
        for _, nets in self._each(lambda h, e: e.networks(cluster)):
            for n in nets:
                seen.setdefault(n.id, n)
        return list(seen.values())

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        """On every reachable host (a node's volumes are made on its own host by
        create_container, from ContainerSpec.volume_labels)."""
        self._each(lambda h, e: e.create_volume(name, labels))

    def remove_volume(self, name: str) -> None:
        """From every reachable host that has one of that name."""
        self._each(lambda h, e: e.remove_volume(name))

    def volumes(self, cluster: str | None = None) -> list[Volume]:
        return [v for _, vols in self._each(lambda h, e: e.volumes(cluster)) for v in vols]

    # -- where containers are ----------------------------------------------------------
    def _remember(self, host: str, *refs: str) -> None:
        with self._lock:
            for r in refs:
                if r:
                    self._where[r] = host

    def _forget(self, ref: str) -> None:
        with self._lock:
            self._where.pop(ref, None)

    def _cached(self, ref: str) -> str | None:
        with self._lock:
            h = self._where.get(ref)
            if h is None and len(ref) >= 12:
                h = next((v for k, v in self._where.items() if len(k) == 64 and k.startswith(ref)), None)
        return h

    def locate(self, ref: str) -> str:
        """The host holding container `ref` (id or name); ObjectMissing when no reachable
        host has it. Of several of that name, a running one, else the first host's."""
        h = self._cached(ref)
        if h is not None and not self._is_down(h):
            return h
        found: list[tuple[bool, int, str, str]] = []
        order = {x: i for i, x in enumerate(self._engines)}
        for host, d in self._each(lambda h, e: _inspect_or_none(e, ref)):
            if d is not None:
                found.append((not d.state.running, order[host], host, d.id))
        if not found:
            if h is not None:  # on a host that does not answer
                raise HostUnavailable(h, self.unreachable().get(h, "unreachable"))
            down = self.unreachable()
            away = f" ({', '.join(sorted(down))} {'does' if len(down) == 1 else 'do'} not answer)" if down else ""
            raise ObjectMissing(f"no such container {ref} on any reachable host{away}")
        _, _, host, cid = min(found)
        self._remember(host, ref, cid)
        return host

    def host_of(self, ref: str) -> str:
        return self.locate(ref)

    def _on(self, ref: str, fn: Callable[[Any], T]) -> T:
        host = self.locate(ref)
        try:
            return self._call(host, fn)
        except ObjectMissing:
            self._forget(ref)  # it moved (replaced on another host): look again, once
            again = self.locate(ref)
            if again == host:
                raise
            return self._call(again, fn)

    # -- containers ---------------------------------------------------------------------
    def _target(self, spec: ContainerSpec) -> str:
        if spec.host:
            self.engine(spec.host)
            return spec.host
        if spec.network_of:
            return self.locate(spec.network_of)
        live = self.live()
        if not live:
            self.ping()
        return live[0]

    def create_container(self, spec: ContainerSpec) -> str:
        host = self._target(spec)

        def create(e: Any) -> str:
            for vol, lab in spec.volume_labels.items():
                if vol in spec.volumes:
                    e.create_volume(vol, lab)  # idempotent: an existing volume is kept
            try:
                return e.create_container(spec)
            except ObjectMissing:
                if e.image_id(spec.image) is not None or self.source.image_id(spec.image) is None:
                    raise
            self._ensure_image(host, spec.image)  # placed on a host that lacks the image: bring it
            return e.create_container(spec)

        cid = self._call(host, create)
        self._remember(host, cid, spec.name)
        return cid

    def start(self, container: str) -> None:
        self._on(container, lambda e: e.start(container))

    def restart(self, container: str, timeout: int = 2) -> None:
        self._on(container, lambda e: e.restart(container, timeout))

    def kill(self, container: str) -> None:
        try:
            self._on(container, lambda e: e.kill(container))
        except ObjectMissing:
            pass

    def remove_container(self, container: str) -> None:
        try:
            self._on(container, lambda e: e.remove_container(container))
        except ObjectMissing:
            return
        self._forget(container)

    def containers(self, cluster: str | None = None, extra_labels: dict[str, str] | None = None) -> list[Container]:
        out: list[Container] = []
        for host, cs in self._each(lambda h, e: e.containers(cluster, extra_labels)):
            for c in cs:
                self._remember(host, c.id)
                out.append(c)
        # names: a running container's host wins (a stale copy may sit on a host that came back)
        for c in sorted(out, key=lambda c: c.running):
            self._remember(c.host, c.name)
        return out

    def inspect(self, container: str) -> ContainerDetails:
        return self._on(container, lambda e: e.inspect(container))

    def logs(self, container: str, tail: int | str = "all") -> str:
        return self._on(container, lambda e: e.logs(container, tail))

    def follow_logs(self, container: str, since: float | None = None) -> LineStream:
        return self._on(container, lambda e: e.follow_logs(container, since))

    def run_once(self, spec: ContainerSpec, timeout: float = 120.0) -> ExecResult:
        host = self._target(spec)
        if self._call(host, lambda e: e.image_id(spec.image)) is None and self.source.image_id(spec.image):
            self._ensure_image(host, spec.image)
        return self._call(host, lambda e: e.run_once(spec, timeout))

    def put_files(self, container: str, directory: str, files: FileMap) -> None:
        self._on(container, lambda e: e.put_files(container, directory, files))

    def get_file(self, container: str, path: str) -> bytes:
        return self._on(container, lambda e: e.get_file(container, path))

    def get_dir(self, container: str, path: str) -> dict[str, bytes]:
        return self._on(container, lambda e: e.get_dir(container, path))

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
        return self._on(
            container,
            lambda e: e.exec(container, cmd, user=user, workdir=workdir, environment=environment, stdin=stdin),
        )

    def exec_stream(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecHandle:
        host = self.locate(container)
        h = self._call(
            host, lambda e: e.exec_stream(container, cmd, user=user, workdir=workdir, environment=environment)
        )
        with self._lock:
            self._execs[h.id] = host
        return h

    def exec_exit_code(self, handle: ExecHandle) -> int:
        with self._lock:
            host = self._execs.pop(handle.id, None)
        if host is None:
            raise EngineError(f"exec {handle.id}: not started by this provider", 404)
        return self._call(host, lambda e: e.exec_exit_code(handle))

    def exec_interactive(
        self,
        container: str,
        cmd: list[str],
        *,
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> int:
        return self._on(
            container,
            lambda e: e.exec_interactive(container, cmd, user=user, workdir=workdir, environment=environment),
        )

    def events(self, cluster: str | None = None) -> MergedEvents:
        return MergedEvents(self, cluster)

    # -- images: built and kept on the local engine (the source) ------------------------
    def image_id(self, ref: str) -> str | None:
        return self.source.image_id(ref)

    def pull(self, repo: str, tag: str) -> None:
        self.source.pull(repo, tag)

    def import_image(self, tar_path: Path, repo: str, tag: str, changes: list[str]) -> None:
        self.source.import_image(tar_path, repo, tag, changes)

    def build_image(self, context: Path, tag: str, target: str | None, buildargs: dict[str, str], log: Log) -> None:
        self.source.build_image(context, tag, target, buildargs, log)

    def tag_image(self, ref: str, repo: str, tag: str) -> None:
        self.source.tag_image(ref, repo, tag)

    def save_images(self, refs: list[str]) -> Iterator[bytes]:
        return self.source.save_images(refs)

    def load_images(self, data: IO[bytes] | bytes | Iterable[bytes]) -> list[str]:
        return self.source.load_images(data)

    def read_image_file(self, ref: str, path: str) -> bytes:
        return self.source.read_image_file(ref, path)

    # -- images on the hosts --------------------------------------------------------------
    def missing_images(self, refs: list[str]) -> dict[str, list[str]]:
        """Reachable host -> the refs it lacks (or holds with another image id than the
        source: a tag moved by a rebuild)."""
        want = {r: self.source.image_id(r) for r in refs}
        absent = [r for r, i in want.items() if i is None]
        if absent:
            raise ObjectMissing(f"images not built on the local engine: {', '.join(absent)} (hp images build)")
        have = self._each(lambda h, e: {r: e.image_id(r) for r in refs})
        return {h: [r for r in refs if ids[r] != want[r]] for h, ids in have if any(ids[r] != want[r] for r in refs)}

    def prepare_images(self, refs: list[str], log: Log) -> None:
        need = self.missing_images(refs)
        if not need:
            return
        if self.registry:
            for host, rs in need.items():
                for r in rs:
                    log(f"pulling {self.registry}/{r} on {host}")
                    self._pull_as(host, r)
            return
        union = sorted({r for rs in need.values() for r in rs})
        hosts = sorted(need, key=list(self._engines).index)
        log(f"streaming {', '.join(union)} from the local engine to {', '.join(hosts)}")
        self.fan_out(union, hosts, log)

    def _pull_as(self, host: str, ref: str) -> None:
        repo, tag = ref.rsplit(":", 1)
        remote = f"{self.registry.rstrip('/')}/{repo}"  # type: ignore[union-attr]
        self._call(host, lambda e: e.pull(remote, tag))
        self._call(host, lambda e: e.tag_image(f"{remote}:{tag}", repo, tag))

    def _ensure_image(self, host: str, ref: str) -> None:
        with self._image_locks[host]:
            if self._call(host, lambda e: e.image_id(ref)) == self.source.image_id(ref):
                return
            log.info("image %s is missing on %s: %s", ref, host, "pulling" if self.registry else "streaming it")
            if self.registry:
                self._pull_as(host, ref)
            else:
                self.fan_out([ref], [host], log.info)

    def fan_out(self, refs: list[str], hosts: list[str], progress: Log) -> int:
        """One save of `refs` from the source, loaded into every host at once (a bounded
        queue per host: the slowest sets the pace). Returns the bytes streamed."""
        queues: dict[str, queue.Queue[bytes | None]] = {h: queue.Queue(maxsize=FANOUT_DEPTH) for h in hosts}
        errors: dict[str, EngineError | EngineUnavailable] = {}

        def chunks(q: queue.Queue[bytes | None]) -> Iterator[bytes]:
            while (b := q.get()) is not None:
                yield b

        def load(h: str) -> None:
            q = queues[h]
            try:
                self._call(h, lambda e: e.load_images(chunks(q)))
            except (EngineError, EngineUnavailable) as e:  # re-raised below, once every host is done
                errors[h] = e
                while q.get() is not None:  # keep the producer going for the other hosts
                    pass

        threads = [threading.Thread(target=load, args=(h,), daemon=True, name=f"load-{h}") for h in hosts]
        for t in threads:
            t.start()
        sent, next_report, t0 = 0, PROGRESS_EVERY, time.monotonic()
        try:
            for b in self.source.save_images(refs):
                sent += len(b)
                for h, q in queues.items():
                    if h not in errors:
                        q.put(b)
                if sent >= next_report:
                    next_report += PROGRESS_EVERY
                    progress(f"{sent / 1e6:.0f} MB streamed to {', '.join(hosts)}")
        finally:
            for q in queues.values():
                q.put(None)
            for t in threads:
                t.join()
        if errors:
            raise next(iter(errors.values()))
        progress(f"{sent / 1e6:.0f} MB streamed to {', '.join(hosts)} in {time.monotonic() - t0:.1f} s")
        return sent


def _inspect_or_none(e: Any, ref: str) -> ContainerDetails | None:
    try:
        return e.inspect(ref)
    except ObjectMissing:
        return None


class MergedEvents:
    """Container events of every host as one stream: a thread per host reads its
    engine's stream (reconnecting while the host is away); close() ends them all."""

    def __init__(self, mp: MultiHostProvider, cluster: str | None):
        self._mp = mp
        self._cluster = cluster
        self._q: queue.Queue[Event] = queue.Queue()
        self._closed = threading.Event()
        self._streams: dict[str, Any] = {}
        self._lock = threading.Lock()
        for h in mp.engines():
            threading.Thread(target=self._pump, args=(h,), daemon=True, name=f"events-{h}").start()

    def _pump(self, host: str) -> None:
        while not self._closed.is_set():
            if self._mp._is_down(host):
                self._closed.wait(RETRY_S)
                continue
            try:
                s = self._mp._call(host, lambda e: e.events(self._cluster))
                with self._lock:
                    self._streams[host] = s
                for ev in s:
                    if self._closed.is_set():
                        return
                    self._mp._remember(host, ev.container)
                    self._q.put(ev)
            except (EngineError, EngineUnavailable) as e:
                if not self._closed.is_set():
                    log.info("event stream of %s: %s", host, e)
            self._closed.wait(RETRY_S)

    def __iter__(self) -> Iterator[Event]:
        while not self._closed.is_set():
            try:
                yield self._q.get(timeout=0.5)
            except queue.Empty:
                continue

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            streams = list(self._streams.values())
        for s in streams:
            try:
                s.close()
            except (EngineError, EngineUnavailable, OSError):
                pass
