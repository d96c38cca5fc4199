"""Reading clusters: list and nodes (HyperPod's ListClusters and ListClusterNodes shapes),
derived from what Docker and Slurm say now; describe.py adds the groups and services.
A healthy cluster's nodes are read without its spec (their containers' labels name their
group, role and type): `hp nodes` loads no spec model."""

from __future__ import annotations

from typing import Any

from ..core.context import Cluster, Env
from ..errors import EngineUnavailable, OperationFailed
from ..slurm.model import SlurmNode
from ..state.status import NodeView, node_views
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


def observe(cluster: Cluster, slurm_nodes: dict[str, SlurmNode] | None = None) -> tuple[list[NodeView], bool]:
    """The cluster's nodes now. Read in the order writers write (a phase is recorded
    after the Slurm change it describes): the history first (placements, then phases),
    then Docker, then Slurm, so a recorded phase is never newer than the Slurm state
    shown beside it. `slurm_nodes`: Slurm's nodes from a look that ended the caller's
    wait (create's: every phase it recorded came from that look or an earlier one), in
    place of a new query."""
    placed = cluster.placements()  # before the phases: see Cluster.lost_nodes
    recorded = cluster.store.latest_phases(cluster.name)
    containers = cluster.node_containers()
    ctl = cluster.controller_of(containers)
    snodes: dict[str, SlurmNode] = slurm_nodes if slurm_nodes is not None else {}
    up = slurm_nodes is not None and ctl is not None and ctl.running
    if slurm_nodes is None and ctl is not None and ctl.running:
        try:
            snodes = {n.name: n for n in cluster.slurm_in(ctl.name).nodes()}
            up = True
        except OperationFailed:
            up = False
    return node_views(
        lambda: cluster.spec, containers, snodes, recorded, up, cluster.lost_nodes(containers, recorded, placed)
    ), up


def unreachable_view(env: Env) -> dict[str, Any]:
    """With registered hosts: those that do not answer now (host -> why); what they
    hold is shown as last recorded."""
    return {"UnreachableHosts": env.provider.unreachable()} if env.provider.places_nodes else {}


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
