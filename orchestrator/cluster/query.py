"""Reading clusters: list, describe, nodes (HyperPod's ListClusters, DescribeCluster and
ListClusterNodes shapes), derived from what Docker and Slurm say now."""

from __future__ import annotations

from typing import Any

from ..core.context import Cluster, Env
from ..errors import EngineUnavailable, OperationFailed
from ..services.accounting import health
from ..services.endpoints import url
from ..slurm.model import SlurmNode
from ..state.status import NodeView, group_views, node_views
from ..state.store import iso


def list_clusters(env: Env) -> dict[str, Any]:
    """Every recorded cluster. With no engine answering, statuses are what was last
    recorded: said so (EngineReachable false, and each cluster's status marked)."""
    rows = env.store.clusters()
    try:
        env.provider.ping()
        reachable = True
    except EngineUnavailable:
        reachable = False
    return {
        "EngineReachable": reachable,
        "ClusterSummaries": [
            {
                "ClusterName": r.name,
                "ClusterStatus": r.status,
                "CreationTime": iso(r.created),
                **({} if reachable else {"StatusNote": "last recorded: the Docker engine does not answer"}),
            }
            for r in rows
        ],
    }


def observe(cluster: Cluster) -> tuple[list[NodeView], bool]:
    """The cluster's nodes now. Read in the order writers write (a phase is recorded
    after the Slurm change it describes): the history first (placements, then phases),
    then Docker, then Slurm, so a recorded phase is never newer than the Slurm state
    shown beside it."""
    placed = cluster.placements()  # before the phases: see Cluster.lost_nodes
    recorded = cluster.store.latest_phases(cluster.name)
    containers = cluster.node_containers()
    ctl = containers.get(cluster.controller_node)
    snodes: dict[str, SlurmNode] = {}
    up = False
    if ctl is not None and ctl.running:
        try:
            snodes = {n.name: n for n in cluster.slurm.nodes()}
            up = True
        except OperationFailed:
            up = False
    return node_views(
        cluster.spec, containers, snodes, recorded, up, cluster.lost_nodes(containers, recorded, placed)
    ), up


def active_ops(env: Env, name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for op in env.store.operations(name):
        what = f"{op['kind']}" + (f" to {op['target']}" if op["target"] is not None else f" {op['nodes']}")
        out.setdefault(op["group"], []).append(what)
    return out


def describe(env: Env, name: str, services: bool = True) -> dict[str, Any]:
    """DescribeCluster's shape; without `services`, the status and groups alone (what `hp
    create` prints: no slurmdbd health check on its way out)."""
    cluster = env.cluster(name)
    row = env.store.cluster(name)
    assert row is not None
    nodes, up = observe(cluster)
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
        "InstanceGroups": group_views(spec, nodes, active_ops(env, name)),
        **(services_view(cluster) if services else {}),
        **unreachable_view(env),
    }


def unreachable_view(env: Env) -> dict[str, Any]:
    """With registered hosts: those that do not answer now (host -> why); what they
    hold is shown as last recorded."""
    return {"UnreachableHosts": env.provider.unreachable()} if env.multihost else {}


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


def nodes(env: Env, name: str, group: str | None = None) -> dict[str, Any]:
    cluster = env.cluster(name)
    if group is not None:
        cluster.group_of(group)
    views, _ = observe(cluster)
    return {
        "ClusterName": name,
        "ClusterNodeSummaries": [v.as_dict() for v in views if group is None or v.group == group],
        **unreachable_view(env),
    }
