"""Check containers: one per node under check, in the node's network namespace, with
the node's CURRENT cgroup limits and GPUs, labelled so that cleanup finds them."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from ..cluster import Cluster
from ..naming import L_NODE, labels
from ..provider import CheckContainerSpec, ContainerInfo, ExecResult, create_check_container
from .logic import NodeLimits, node_limits

L_REQUEST = "io.hp.health-request"


@dataclass
class Sidecar:
    node: str
    cid: str
    limits: NodeLimits


def start(cluster: Cluster, node: ContainerInfo, image: str, req: str) -> Sidecar:
    """Read the node's limits now (a `docker update` that cut them shows up here) and
    start a check container that shares them and the node's network."""
    p = cluster.p
    doc = p.inspect(node.id)
    lim = node_limits(doc)
    lab = labels(cluster.name, "check", node.labels.get("io.hp.group"), node.labels.get(L_NODE))
    lab[L_REQUEST] = req
    gpus = [g for g in node.labels.get("io.hp.gpus", "").split(",") if g]
    spec = CheckContainerSpec(
        name=f"{node.name}-check-{secrets.token_hex(3)}", image=image, node_container=node.id, labels=lab,
        command=["sleep", "infinity"], nano_cpus=lim.nano_cpus or None, cpu_quota=lim.cpu_quota or None,
        cpu_period=lim.cpu_period or None, memory_bytes=lim.memory_bytes or None, gpus=gpus)
    cid = create_check_container(p, spec)
    p.start(cid)
    return Sidecar(node.labels.get(L_NODE, node.name), cid, lim)


def run(cluster: Cluster, sc: Sidecar, cmd: list[str] | str) -> ExecResult:
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else cmd
    return cluster.p.exec(sc.cid, argv)


def stop(cluster: Cluster, sc: Sidecar) -> None:
    cluster.p.remove_container(sc.cid)


def remove_all(cluster: Cluster, req: str | None = None) -> None:
    """Remove the request's (or every) check container of the cluster."""
    extra = {"io.hp.role": "check", **({L_REQUEST: req} if req else {})}
    for c in cluster.p.containers(cluster.name, extra_labels=extra):
        cluster.p.remove_container(c.id)
