"""A cluster across registered hosts: what it has that a one-engine cluster has not.

- its network is an attachable swarm overlay (`--encrypt-network`: IPsec between hosts,
  and hp proves that traffic passes before it relies on one: `prove_traffic`);
- its /home is a GlusterFS file server container on the controller's host, on the
  cluster's home volume, reached over the overlay by login and compute nodes, which
  mount it (FUSE) before their Slurm daemon starts (`ensure_fileserver`);
- a spec's `Placement` names registered hosts (`placement_problems`);
- every host nodes may go to still runs them (`host_problems`: create's preflight).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..docker.images import MULTIHOST_IMAGES
from ..docker.views import LOCAL_ENGINE, ContainerSpec
from ..errors import EngineError, EngineUnavailable, OperationFailed
from ..naming import L_HOST, fileserver_name, labels, network_name, shared_volume
from ..releases import DEFAULT
from . import hostprobe
from .context import Cluster, Env, parallel

if TYPE_CHECKING:
    from ..spec.model import ClusterSpec

log = logging.getLogger("hp")

FILESERVER_MEMORY = 512 << 20


def host_problems(env: Env, log: Callable[[str], None]) -> list[str]:
    """Create's preflight on registered hosts: every reachable host nodes may be placed
    on still runs them (core/hostprobe.py, as `hp hosts add` checked), probed at once,
    before any image is streamed or any container made."""
    p = env.provider
    down = p.unreachable()
    out = {r.name for r in env.store.hosts() if r.opt("draining") or r.opt("fenced")}
    # the local engine is no registered host (one engine: nothing to probe)
    hosts = [h for h in p.engines() if h != LOCAL_ENGINE and h not in down and h not in out]
    if not hosts:
        return []
    log("probing what nodes need on every host")
    ref = env.images(DEFAULT).base(make=False)[0]  # on the hosts since hp hosts add (else brought now)

    def one(h: str) -> list[str]:
        try:
            return [f"host {h} cannot run hp's nodes now: {x}" for x in hostprobe.problems(p, ref, None, h)]
        except EngineUnavailable as ex:  # gone meanwhile: placement leaves it out
            log(f"host {h}: {str(ex).splitlines()[0][:200]}")
            return []

    return [x for xs in parallel(one, hosts) for x in xs]


def placement_problems(env: Env | None, spec: ClusterSpec) -> list[str]:
    """Placement that names hosts hp does not know (or any host, with none registered);
    Mounts with registered hosts (a host folder is on this machine only)."""
    problems = []
    # registered hosts' names (the local engine's is none of them)
    hosts = [h for h in env.provider.engines() if h != LOCAL_ENGINE] if env is not None else []
    for i, g in enumerate(spec.InstanceGroups):
        if g.Placement is None or not g.Placement.Hosts:
            continue
        if not hosts:
            problems.append(
                f"InstanceGroups[{i}].Placement.Hosts: no host is registered (hp hosts add); "
                "without hosts every node runs on the local engine"
            )
            continue
        unknown = [h for h in g.Placement.Hosts if h not in hosts]
        if unknown:
            problems.append(
                f"InstanceGroups[{i}].Placement.Hosts: unknown host(s) {', '.join(unknown)} "
                f"(registered: {', '.join(hosts)})"
            )
    if spec.Mounts and hosts:
        problems.append(
            "Mounts: a host folder is on this machine only, and with registered hosts (hp hosts add) the nodes run "
            "on other machines that do not have it; put the files in /home (the cluster's file server serves it "
            "to every node) or leave Mounts out"
        )
    return problems


def fileserver_spec(cluster: Cluster, image: str, host: str) -> ContainerSpec:
    name = fileserver_name(cluster.name)
    lab = labels(cluster.name, "fileserver")
    lab[L_HOST] = host
    vol = shared_volume(cluster.name)
    return ContainerSpec(
        name=name,
        image=image,
        hostname=name,
        labels=lab,
        network=network_name(cluster.name),
        volumes={vol: "/export"},
        volume_labels={vol: labels(cluster.name, "shared")},
        cap_add=["SYS_ADMIN"],  # trusted.* extended attributes on the brick
        security_opt=["apparmor=unconfined"],
        memory_bytes=FILESERVER_MEMORY,
        host=host,
    )


def controller_host_of(cluster: Cluster) -> str:
    """The host the controller was placed on (else the first registered host)."""
    placed = cluster.placements().get(cluster.controller_node)
    return placed or next(iter(cluster.p.engines()))


def ensure_fileserver(cluster: Cluster, image: str | None = None) -> str | None:
    """The cluster's file server runs on the controller's host: started when stopped,
    made when missing (its volume, and so /home, is kept), a copy on another host
    removed. None when it cannot be now (its host does not answer). Only for a cluster
    whose provider serves /home from one (its cluster_images: registered hosts)."""
    p = cluster.p
    host = controller_host_of(cluster)
    if host in p.unreachable():
        return None
    mine = [c for c in cluster.containers() if c.role == "fileserver"]
    for c in mine:
        if c.host != host:
            p.remove_container(c.id)
    here = next((c for c in mine if c.host == host), None)
    if here is not None:
        if not here.running:
            p.start(here.id)
        return here.id
    if image is None:
        image = cluster.images.refs(MULTIHOST_IMAGES)["fileserver"]
    try:
        cid = p.create_container(fileserver_spec(cluster, image, host))
    except EngineError as e:
        if not e.conflict:
            raise
        return None  # made by someone else meanwhile: theirs to start
    p.start(cid)
    return cid


def prove_traffic(cluster: Cluster, image: str) -> str:
    """Prove that the cluster's overlay carries traffic between hosts (an encrypted one
    may be created yet carry nothing: IPsec ESP missing from a kernel). A container on
    the first reachable host is pinged from one on every other; OperationFailed naming
    the hosts that cannot reach it. Returns what was proven."""
    p = cluster.p
    down = p.unreachable()
    hosts = [h for h in p.engines() if h not in down]
    if len(hosts) < 2:
        return "one reachable host: no traffic between hosts to prove"
    net = network_name(cluster.name)
    tag = secrets.token_hex(3)
    target = f"hp-{cluster.name}-nettest-{tag}"
    lab = labels(cluster.name, "nettest")
    listener = ContainerSpec(
        name=target, image=image, labels=lab, network=net, hostname=target, command=["sleep", "60"], host=hosts[0]
    )
    cid = p.create_container(listener)
    try:
        p.start(cid)

        def ping(h: str) -> tuple[str, int, str]:
            spec = ContainerSpec(
                name=f"{target}-{h}"[:63],
                image=image,
                labels=lab,
                network=net,
                command=["ping", "-c", "3", "-i", "0.2", "-W", "2", target],
                host=h,
            )
            try:
                r = p.run_once(spec, timeout=30)
            except (EngineError, EngineUnavailable) as e:
                return h, -1, str(e)
            return h, r.exit_code, r.output

        results = parallel(ping, hosts[1:])
    finally:
        p.remove_container(cid)
    bad = [(h, out) for h, code, out in results if code != 0]
    if bad:
        detail = "; ".join(
            f"{h}: {out.strip().splitlines()[-1][:160] if out.strip() else 'no output'}" for h, out in bad
        )
        raise OperationFailed(
            f"the cluster's network carries no traffic from {', '.join(h for h, _ in bad)} to {hosts[0]} ({detail}). "
            "An encrypted overlay needs IPsec (ESP, the kernel's xfrm modules) on every host, and UDP 4789 and "
            "ESP (IP protocol 50) open between them; create the cluster without --encrypt-network, or fix the hosts"
        )
    return f"traffic passes from {', '.join(hosts[1:])} to {hosts[0]}"
