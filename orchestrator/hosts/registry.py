"""The host registry (`hp hosts add|list|remove`) and the swarm that joins the hosts.

With no host registered hp uses the local engine exactly as before (engines.py's
`provider_for` returns a DockerEngine). With hosts, it returns a MultiHostProvider over
their engines, images coming from the local engine.

Swarm. The first host added inits a swarm (advertising `--advertise-addr`, else the
address in its URL, else the engine's choice), or, when it already is a swarm manager,
hp uses that swarm as it is. Other hosts join it with the join tokens of a manager
(a host already in that swarm is taken as it is; one in another swarm is refused). In a
swarm hp made, the first hosts are managers, at most three and an odd number (1, 1, 3,
3, 3...: two managers would lose quorum with either host): with one manager, losing its
host blocks new containers from joining overlay networks; with three, any one host may
be lost. In a swarm hp did not make, roles are left as they are.

Nothing half-done: a host that cannot be reached, of another architecture, that cannot
run the nodes (core/hostprobe.py: no FUSE device for containers, no mount, the swarm's ports
closed), in another swarm, or that fails to join is not recorded (and a join that went
through is undone).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from .. import waits
from ..core import hostprobe
from ..core.context import Cluster, Env, parallel
from ..docker import engine as engine_mod
from ..docker.engine import DockerEngine
from ..docker.images import Images
from ..docker.multihost import PING_TIMEOUT_S
from ..docker.views import EngineInfo
from ..errors import BadInput, EngineError, EngineUnavailable, NotFound, OperationFailed
from ..gpu.inventory import KEY as GPU_KEY
from ..gpu.inventory import HostGpuInfo
from ..naming import L_CLUSTER, NODE_ROLES, node_name
from ..recovery import actions
from ..releases import DEFAULT
from ..spec.model import name_problem
from ..state.phases import Phase
from ..state.store import HostRow, Store
from .engines import engine_for

log = logging.getLogger("hp.hosts")
Log = Callable[[str], None]

SWARM_KEY = "hosts.swarm"  # "created" (hp made the swarm: it manages roles) or "existing"
SCHEMES = ("unix", "tcp", "ssh")
MAX_MANAGERS = 3
JOIN_WAIT_S = 30.0
ADD_TIMEOUT_S = 10.0
IMAGE_STREAM_TIMEOUT_S = 600.0  # one call of an image stream to a host (docker load answers at its end)


def swarm_mode(store: Store) -> str:
    return store.get(SWARM_KEY) or ("existing" if store.hosts() else "none")


def managers_wanted(n: int) -> int:
    """Managers in a swarm hp made of n hosts: odd, at most MAX_MANAGERS."""
    k = min(MAX_MANAGERS, n)
    return k if k % 2 else max(k - 1, 1)


# -- add ------------------------------------------------------------------------------
def _advertise(url: str, given: str | None) -> str | None:
    """The address a host advertises to the swarm: --advertise-addr, else the IP of the
    URL's host (tcp://, ssh://), else None (the engine picks its only address)."""
    if given:
        return given
    u = urlparse(url)
    if u.scheme in ("tcp", "ssh") and u.hostname:
        try:
            return str(ipaddress.ip_address(u.hostname))
        except ValueError:
            try:
                return socket.gethostbyname(u.hostname)
            except OSError:
                return None
    return None


def add_problems(
    store: Store, name: str, url: str, cpus: int | None, memory_mib: int | None, mtu: int | None
) -> list[str]:
    problems = []
    if p := name_problem("host name", name):
        problems.append(p)
    elif any(r.name == name for r in store.hosts()):
        problems.append(f"a host named {name!r} is already registered (hp hosts list)")
    scheme = urlparse(url).scheme
    if scheme not in SCHEMES:
        problems.append(f"--docker-host must be unix://, tcp:// or ssh://, got {url!r}")
    elif any(r.url == url for r in store.hosts()):
        problems.append(f"{url} is already registered as host {next(r.name for r in store.hosts() if r.url == url)!r}")
    if cpus is not None and cpus < 1:
        problems.append(f"--cpus must be >= 1, got {cpus}")
    if memory_mib is not None and memory_mib < 256:
        problems.append(f"--memory-mib must be >= 256, got {memory_mib}")
    if mtu is not None and not 576 <= mtu <= 9216:
        problems.append(f"--mtu must be between 576 and 9216, got {mtu}")
    return problems


def add(
    store: Store,
    name: str,
    url: str,
    *,
    cpus: int | None = None,
    memory_mib: int | None = None,
    tls_dir: str | None = None,
    advertise_addr: str | None = None,
    mtu: int | None = None,
    log: Log = lambda s: None,
) -> dict[str, Any]:
    """Register a host: reach its engine, check it, put it in the swarm, record it."""
    if problems := add_problems(store, name, url, cpus, memory_mib, mtu):
        raise BadInput(problems, "cannot add host")
    doc: dict[str, Any] = {k: v for k, v in (("cpus", cpus), ("memory_mib", memory_mib), ("tls_dir", tls_dir)) if v}
    row = HostRow(name, url, doc, 0, 0.0)
    eng = engine_for(row, timeout=ADD_TIMEOUT_S, answer_timeout=ADD_TIMEOUT_S)
    try:
        eng.ping(timeout=ADD_TIMEOUT_S)
        info = eng.info()
    except EngineUnavailable as e:
        raise EngineUnavailable(f"cannot reach the Docker engine of host {name} at {url}: {_first(e)}") from None
    _check_same_kind(store, name, info)
    others = store.hosts()
    # the probe image streamed with calls of their own length: a load answers once it is done
    # (seconds on a busy machine: ADD_TIMEOUT_S cut it, 'Read timed out', with the e2e suite beside it)
    streamer = engine_for(row, timeout=IMAGE_STREAM_TIMEOUT_S, answer_timeout=ADD_TIMEOUT_S)
    _check_nodes_run(eng, streamer, name, _manager(store)[2].swarm_addr if others else None, log)
    advertise = _advertise(url, advertise_addr)
    joined = False
    if not others:
        mode = _first_host_swarm(eng, name, info, advertise, log)
        store.put(SWARM_KEY, mode)
    else:
        joined = _join(store, eng, name, info, advertise, log)
    info = eng.info(refresh=True)
    doc.update(
        {
            "arch": info.arch,
            "engine": info.name,
            "swarm_node_id": info.swarm_node_id,
            **({"advertise_addr": advertise_addr} if advertise_addr else {}),
            **({"mtu": mtu} if mtu else {}),
        }
    )
    if not store.add_host(name, url, doc):  # pragma: no cover - the name was checked above
        if joined:
            eng.swarm_leave()
        raise BadInput(f"a host named {name!r} is already registered", "cannot add host")
    if swarm_mode(store) == "created":
        try:
            rebalance(store, log)
        except (EngineError, EngineUnavailable) as e:  # the host is in; roles are fixed by the next add/remove
            log(f"note: swarm roles not rebalanced: {_first(e)}")
    return {"Name": name, "DockerHost": url, "Architecture": info.arch, "SwarmNodeId": info.swarm_node_id}


def _first(e: BaseException) -> str:
    return str(e).splitlines()[0][:300] if str(e) else type(e).__name__


def _check_same_kind(store: Store, name: str, info: EngineInfo) -> None:
    """Every host runs the images built on the local engine: same architecture."""
    archs = {r.name: r.opt("arch") for r in store.hosts() if r.opt("arch")}
    try:
        local = engine_mod.DockerEngine(timeout=5).info().arch
        archs.setdefault("the local engine (where images are built)", local)
    except (EngineUnavailable, EngineError):
        pass
    for other, arch in archs.items():
        if arch and arch != info.arch:
            raise BadInput(
                f"host {name} is {info.arch}, {other} is {arch}: hp's images are built for one architecture",
                "cannot add host",
            )
    if info.os and "windows" in info.os.lower():
        raise BadInput(f"host {name} runs Windows containers ({info.os}): hp needs a Linux engine", "cannot add host")


def _check_nodes_run(eng: DockerEngine, streamer: DockerEngine, name: str, manager: str | None, log: Log) -> None:
    """A probe container on the host: the FUSE device, mounting, the swarm's ports (its
    image streamed through `streamer`, the same engine with long calls)."""
    local = engine_mod.DockerEngine()
    ref, iid = Images(local, DEFAULT).base(log)
    hostprobe.ensure_image(streamer, local, ref, iid, log)
    if problems := hostprobe.problems(eng, ref, manager):
        raise BadInput([f"host {name} cannot run hp's nodes: {p}" for p in problems], "cannot add host")


def _first_host_swarm(eng: DockerEngine, name: str, info: EngineInfo, advertise: str | None, log: Log) -> str:
    if info.swarm_state == "active":
        if not info.swarm_manager:
            raise BadInput(
                f"host {name} is a worker of an existing swarm: register one of its managers first", "cannot add host"
            )
        log(f"{name}: using the swarm it is a manager of, as it is")
        return "existing"
    if info.swarm_state != "inactive":
        raise OperationFailed(f"host {name}: its swarm is {info.swarm_state}: fix or leave it (docker swarm leave)")
    log(f"{name}: initialising a swarm" + (f" (advertising {advertise})" if advertise else ""))
    try:
        eng.swarm_init(advertise)
    except EngineError as e:
        hint = " (give its address with --advertise-addr)" if "advertise" in str(e).lower() else ""
        raise OperationFailed(f"host {name}: cannot initialise a swarm: {_first(e)}{hint}") from None
    return "created"


def _manager(store: Store, skip: str | None = None) -> tuple[str, DockerEngine, EngineInfo]:
    """A reachable swarm manager among the registered hosts."""
    why = []
    for r in store.hosts():
        if r.name == skip:
            continue
        e = engine_for(r, timeout=ADD_TIMEOUT_S)
        try:
            e.ping(timeout=PING_TIMEOUT_S)
            i = e.info(refresh=True)
        except (EngineUnavailable, EngineError) as ex:
            why.append(f"{r.name}: {_first(ex)}")
            continue
        if i.swarm_manager:
            return r.name, e, i
        why.append(f"{r.name}: not a manager")
    raise OperationFailed("no swarm manager among the registered hosts answers: " + "; ".join(why))


def _join(store: Store, eng: DockerEngine, name: str, info: EngineInfo, advertise: str | None, log: Log) -> bool:
    """Join the hosts' swarm; True when this call made it join."""
    mname, mgr, minfo = _manager(store)
    if info.swarm_state == "active":
        ids = {n["id"] for n in mgr.swarm_nodes()}
        if info.swarm_node_id in ids:
            log(f"{name}: already in the hosts' swarm")
            return False
        raise BadInput(
            f"host {name} is in another swarm (node {info.swarm_node_id[:12]}): "
            "make it leave (docker swarm leave) or register that swarm's hosts",
            "cannot add host",
        )
    if info.swarm_state != "inactive":
        raise OperationFailed(f"host {name}: its swarm is {info.swarm_state}: fix or leave it (docker swarm leave)")
    token = mgr.swarm_tokens().get("Worker", "")
    log(f"{name}: joining the swarm of {mname} ({minfo.swarm_addr})")
    try:
        eng.swarm_join([f"{minfo.swarm_addr}:2377"], token, advertise)
        node_id = eng.info(refresh=True).swarm_node_id
        waits.until(
            lambda: any(n["id"] == node_id and n["state"] == "ready" for n in mgr.swarm_nodes()),
            every=0.2,
            timeout=JOIN_WAIT_S,
            error=lambda _: OperationFailed(
                f"host {name} joined but is not ready in the swarm after {JOIN_WAIT_S:g} s"
            ),
        )
    except (EngineError, EngineUnavailable, OperationFailed) as e:
        try:  # nothing half-done
            eng.swarm_leave()
            if node_id := eng.info(refresh=True).swarm_node_id:
                mgr.swarm_remove_node(node_id)
        except (EngineError, EngineUnavailable):
            pass
        raise OperationFailed(f"host {name} cannot join the swarm of {mname}: {_first(e)}") from None
    return True


def rebalance(store: Store, log: Log = lambda s: None) -> None:
    """In a swarm hp made: the first managers_wanted(n) hosts are managers, the others workers."""
    rows = store.hosts()
    if not rows:
        return
    _, mgr, _ = _manager(store)
    nodes = {n["id"]: n for n in mgr.swarm_nodes()}
    k = managers_wanted(len(rows))
    for i, r in enumerate(rows):
        n = nodes.get(r.opt("swarm_node_id", ""))
        if n is None or n["state"] != "ready":
            continue
        want = "manager" if i < k else "worker"
        if n["role"] != want:
            log(f"{r.name}: swarm {n['role']} -> {want}")
            mgr.swarm_set_role(n["id"], want)


# -- list -----------------------------------------------------------------------------
def listing(store: Store) -> dict[str, Any]:
    """Every registered host now: engine, size, GPUs, swarm role and state, reachability,
    the nodes placed there."""
    rows = store.hosts()
    swarm: dict[str, dict[str, str]] = {}
    try:
        _, mgr, _ = _manager(store)
        swarm = {n["id"]: n for n in mgr.swarm_nodes()}
    except (OperationFailed, EngineError, EngineUnavailable):
        pass
    out = []
    for r in rows:
        e = engine_for(r, timeout=5)
        d: dict[str, Any] = {
            "Name": r.name,
            "DockerHost": r.url,
            "Reachable": False,
            "Error": None,
            "EngineVersion": None,
            "Architecture": r.opt("arch"),
            "Cpus": None,
            "MemoryMiB": None,
            "CapacityOverride": {"Cpus": r.opt("cpus"), "MemoryMiB": r.opt("memory_mib")},
            "Gpus": None,
            "SwarmNodeId": r.opt("swarm_node_id"),
            "SwarmRole": None,
            "SwarmState": None,
            "Draining": bool(r.opt("draining")),
            "Mtu": r.opt("mtu"),
            "Nodes": [],
        }
        n = swarm.get(r.opt("swarm_node_id", ""))
        if n is not None:
            d["SwarmRole"], d["SwarmState"] = n["role"], n["state"]
        try:
            e.ping(timeout=PING_TIMEOUT_S)
            info = e.info()
            containers = e.containers()
        except (EngineUnavailable, EngineError) as ex:
            d["Error"] = _first(ex)
            out.append(d)
            continue
        d.update(
            Reachable=True,
            EngineVersion=info.server_version,
            Architecture=info.arch,
            Cpus=info.cpus,
            MemoryMiB=info.memory_mib,
        )
        if n is None and info.swarm_state != "active":
            d["SwarmState"] = f"not in a swarm ({info.swarm_state})"
        if cached := store.get(GPU_KEY + (info.name or "local")):
            try:
                d["Gpus"] = len(HostGpuInfo.from_json(cached).gpus)
            except (ValueError, KeyError, TypeError):
                d["Gpus"] = None
        d["Nodes"] = sorted(
            (
                {"Cluster": c.labels.get(L_CLUSTER, ""), "Node": c.node, "State": c.state}
                for c in containers
                if c.role in NODE_ROLES and c.node
            ),
            key=lambda x: (x["Cluster"], x["Node"] or ""),
        )
        out.append(d)
    return {"Swarm": {"Mode": swarm_mode(store)}, "Hosts": out}


# -- remove ---------------------------------------------------------------------------
def nodes_on(store: Store, host: str, engine: DockerEngine | None) -> dict[str, list[tuple[str, str]]]:
    """Cluster -> [(node, role)] of live clusters' nodes on `host`: what its engine lists,
    else (unreachable) where the store says they were placed."""
    live = {c.name for c in store.clusters()}
    out: dict[str, list[tuple[str, str]]] = {}
    seen = False
    if engine is not None:
        try:
            for c in engine.containers():
                cl = c.labels.get(L_CLUSTER, "")
                if cl in live and c.role in NODE_ROLES + ("fileserver",) and (c.node or c.role == "fileserver"):
                    out.setdefault(cl, []).append((c.node or c.name, c.role))
            seen = True
        except (EngineUnavailable, EngineError):
            pass
    if not seen:
        for cl, node in store.nodes_on_host(host):
            row = store.cluster(cl)
            if row is None:
                continue
            if store.latest_phases(cl).phase(node) is not Phase.REMOVED:
                out.setdefault(cl, []).append((node, "controller" if node == _controller_of(row.spec) else "node"))
    return out


def _controller_of(spec: dict[str, Any]) -> str:
    for g in spec.get("InstanceGroups") or []:
        if (g.get("SlurmConfig") or {}).get("NodeType") == "Controller":
            return node_name(str(g.get("InstanceGroupName", "")), 1)
    return ""


def remove(env: Env, name: str, drain: bool = False, log: Log = lambda s: None) -> dict[str, Any]:
    """Unregister a host: refused while a controller lives there (exit 2), or nodes do
    (exit 2) unless `drain`, which replaces them on other hosts first (same Slurm names).
    Then the host leaves the swarm hp made (demoted first when it was a manager)."""
    store: Store = env.store
    row = next((r for r in store.hosts() if r.name == name), None)
    if row is None:
        raise NotFound(f"no registered host named {name!r} (hp hosts list)")
    eng = engine_for(row, timeout=ADD_TIMEOUT_S)
    try:
        eng.ping(timeout=3)
        reachable: DockerEngine | None = eng
    except EngineUnavailable:
        reachable = None
    placed = nodes_on(store, name, reachable)
    ctl = sorted(cl for cl, ns in placed.items() for n, role in ns if role in ("controller", "fileserver"))
    if ctl:
        raise BadInput(
            f"host {name} holds the controller of cluster(s) {', '.join(sorted(set(ctl)))}: a cluster has one "
            "controller, which does not move (delete the cluster first)",
            "cannot remove host",
        )
    count = sum(len(v) for v in placed.values())
    if count and not drain:
        listed = ", ".join(f"{cl}/{n}" for cl, ns in sorted(placed.items()) for n, _ in ns)
        raise BadInput(
            f"host {name} holds {count} node(s) ({listed}): move them with --drain, or delete them first",
            "cannot remove host",
        )
    moved: list[str] = []
    if count:
        store.update_host(name, draining=True)  # placement leaves it out from now on
        failed: list[str] = []
        for cl, ns in sorted(placed.items()):
            cluster = Cluster(env, cl)
            log(f"moving {len(ns)} node(s) of cluster {cl} off {name}")

            def one(n: str, cluster: Cluster = cluster) -> bool:
                return actions.replace(cluster, n, f"host {name} is being removed (hp hosts remove --drain)")

            for (n, _), ok in zip(ns, parallel(lambda t: one(t[0]), ns), strict=True):
                (moved if ok else failed).append(f"{cl}/{n}")
        if failed:
            raise OperationFailed(
                f"host {name} is kept (draining: no new node goes there): {len(failed)} node(s) could not be "
                f"moved: {', '.join(failed)}; see 'hp events'"
            )
    _leave_swarm(store, row, reachable, log)
    store.remove_host(name)
    if not store.hosts():
        store.put(SWARM_KEY, None)
    elif swarm_mode(store) == "created":
        try:
            rebalance(store, log)
        except (EngineError, EngineUnavailable, OperationFailed) as e:
            log(f"note: swarm roles not rebalanced: {_first(e)}")
    return {"Name": name, "Removed": True, "Moved": moved}


def _leave_swarm(store: Store, row: HostRow, eng: DockerEngine | None, log: Log) -> None:
    if swarm_mode(store) != "created":
        return
    node_id = row.opt("swarm_node_id", "")
    others = [r for r in store.hosts() if r.name != row.name]
    if others:
        try:
            _, mgr, _ = _manager(store, skip=row.name)
            roles = {n["id"]: n["role"] for n in mgr.swarm_nodes()}
            if roles.get(node_id) == "manager":
                log(f"{row.name}: demoting it before it leaves the swarm")
                mgr.swarm_set_role(node_id, "worker")
        except (OperationFailed, EngineError, EngineUnavailable) as e:
            log(f"note: {row.name} not demoted: {_first(e)}")
            mgr = None
    else:
        mgr = None
    if eng is not None:
        try:
            eng.swarm_leave()
        except (EngineError, EngineUnavailable) as e:
            log(f"note: {row.name} did not leave the swarm: {_first(e)}")
    if mgr is not None and node_id:
        try:  # a node that just left is removed once the managers see it down
            waits.until(
                lambda: mgr.swarm_remove_node(node_id), lambda _: True, every=0.5, timeout=10, retry_on=EngineError
            )
        except EngineError as e:
            log(f"note: swarm node of {row.name} not removed: {_first(e)}")
