"""Check containers: one per node under check, in the node's network namespace, with
the node's CURRENT cgroup limits and GPUs, labelled so that cleanup finds them."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ...core.context import Cluster
from ...docker.views import LOCAL_ENGINE, Container, ContainerSpec, ExecResult, Limits
from ...gpu.wiring import GpuWiring
from ...naming import L_REQUEST, L_ROLE, labels


@dataclass
class Sidecar:
    node: str
    cid: str
    limits: Limits
    host: str = LOCAL_ENGINE  # the registered host it (and its node) runs on


def start(cluster: Cluster, node: Container, image: str, req: str, gpus: GpuWiring | None = None) -> Sidecar:
    """Read the node's limits now (a `docker update` that cut them shows up here) and
    start a check container that shares them and the node's network (and, with
    `gpus`, the node's GPUs, wired as the node has them)."""
    p = cluster.p
    lim = p.inspect(node.id).limits
    lab = labels(cluster.name, "check", node.group, node.node)
    lab[L_REQUEST] = req
    spec = ContainerSpec(
        name=f"{node.name}-check-{secrets.token_hex(3)}",
        image=image,
        labels=lab,
        network_of=node.id,
        command=["sleep", "infinity"],
        cpu_limit=(lim.nano_cpus / 1e9) if lim.nano_cpus else None,
        cpu_quota=lim.cpu_quota or None,
        cpu_period=lim.cpu_period or None,
        memory_bytes=lim.memory_bytes or None,
        gpus=gpus,
    )
    cid = p.create_container(spec)
    p.start(cid)
    return Sidecar(node.node or node.name, cid, lim, node.host)


def run(cluster: Cluster, sc: Sidecar, argv: list[str]) -> ExecResult:
    """Run a tool in the check container: an argv list, never a shell string."""
    return cluster.p.exec(sc.cid, argv)


def stop(cluster: Cluster, sc: Sidecar) -> None:
    cluster.p.remove_container(sc.cid)


def remove_all(cluster: Cluster, req: str | None = None) -> None:
    """Remove the request's (or every) check container of the cluster."""
    extra = {L_ROLE: "check", **({L_REQUEST: req} if req else {})}
    for c in cluster.p.containers(cluster.name, extra_labels=extra):
        cluster.p.remove_container(c.id)
