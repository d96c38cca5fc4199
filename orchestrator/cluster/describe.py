"""Describing a cluster (HyperPod's DescribeCluster shape): its status, groups and
services, derived from what Docker and Slurm say now (query.py's observe)."""

from __future__ import annotations

from typing import Any

from ..core.context import Cluster, Env
from ..errors import TRANSIENT
from ..services.accounting import health
from ..services.ports import url
from ..slurm.model import SlurmNode
from ..state.status import group_views
from ..state.store import iso
from .query import observe, unreachable_view


def active_ops(env: Env, name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for op in env.store.operations(name):
        what = f"{op.kind} " + (",".join(op.nodes) if op.nodes else f"to {op.target}" if op.target is not None else "")
        what = what.strip()
        out.setdefault(op.group, []).append(what)
    return out


def describe(
    env: Env, name: str, services: bool = True, slurm_nodes: dict[str, SlurmNode] | None = None
) -> dict[str, Any]:
    """DescribeCluster's shape; without `services`, the status and groups alone (what `hp
    create` prints: no slurmdbd health check on its way out). `slurm_nodes`: as observe's
    (create's last look at Slurm)."""
    cluster = env.cluster(name)
    row = env.store.cluster(name)
    assert row is not None
    nodes, up = observe(cluster, slurm_nodes)
    spec = cluster.spec
    return {
        "ClusterName": name,
        "ClusterStatus": row.status,
        "FailureMessage": row.message or None,
        "CreationTime": iso(row.created),
        "NodeRecovery": spec.NodeRecovery,
        "NodeProvisioningMode": spec.NodeProvisioningMode or "AllOrNothing",
        "ControllerReachable": up,
        "SlurmControllerHost": cluster.controller_node,
        "SlurmVersion": spec.release.value,
        "InstanceGroups": group_views(spec, nodes, active_ops(env, name)),
        **({"SlurmPackageVersion": package_version(cluster), **services_view(cluster)} if services else {}),
        **unreachable_view(env),
    }


def package_version(cluster: Cluster) -> str | None:
    """Debian's exact Slurm package version (`26.05.5-1`) in the image the controller runs;
    None without a controller container, when the engine does not answer, or while a
    registered host does not (a second listing over the hosts would wait on it again, for a
    fact that does not change: `hp describe` stays within its bound with a host down)."""
    if cluster.p.unreachable():
        return None
    ctl = cluster.controller_of(cluster.node_containers())
    try:
        return cluster.env.slurm_version(ctl.image, ctl.image_id) if ctl is not None else None
    except TRANSIENT:
        return None


def services_view(cluster: Cluster) -> dict[str, Any]:
    """The cluster services: Accounting and Rest as set, slurmdbd's health
    (SlurmHealthMetadata) and the agent's loopback endpoints."""
    spec, store = cluster.spec, cluster.store
    rest = url(store, cluster.name, "rest") if spec.rest else None
    return {
        "Accounting": {"Enabled": spec.accounting},
        "Rest": {"Enabled": spec.rest},
        "SlurmHealth": [health(cluster).as_dict()] if spec.accounting else [],
        "Endpoints": {"Rest": rest, "Metrics": url(store, cluster.name, "metrics")},
    }
