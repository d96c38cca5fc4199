"""On-start deep health checks: new nodes of a group with OnStartDeepHealthChecks are
checked before they take jobs.

The nodes register drained (the Launcher adds `State=DRAIN Reason=ONSTART_REASON` to
their `slurmd -Z --conf`), so no job can land on them before the check. The cluster's
agent (OnStartQueue, orchestrator/agent/onstart_queue.py) calls check_new_nodes(cluster, nodes) on its
own thread once they joined Slurm. Each group's nodes become one recorded request
(options `on_start: true`, shown by `hp health-check status`), run in the calling
process: the on-start drain counts as hp's own, so a node that passes is resumed; one
that fails stays drained (or is recovered, NodeRecovery: Automatic); a node drained for
any other reason meanwhile is left as it is.

One request per cluster at a time: while another (e.g. an on-demand one) is active this
raises ClusterBusy and checks nothing; the agent retries the batch a few seconds later.
"""

from __future__ import annotations

import os

from ...core.context import Cluster
from ...errors import OperationFailed
from ...naming import group_prefix
from ...state.health_requests import Records
from .decisions import Outcome
from .runner import Options, run_and_record
from .service import reap_dead


class ClusterBusy(OperationFailed):
    """Another health-check request is active on the cluster: try again later."""


def plan(cluster: Cluster, nodes: list[str]) -> list[tuple[str, list[str], list[str], list[str]]]:
    """(group, its on-start checks, its new nodes, connectivity peers) for each group
    with on-start checks. InstanceConnectivity needs two nodes: a group's lone new node
    is paired with one of the group's nodes in service (a peer, neither drained nor
    judged)."""
    out = []
    usable = sorted(n.name for n in cluster.slurm.nodes() if n.usable)
    for g in cluster.spec.InstanceGroups:
        if not g.OnStartDeepHealthChecks or g.node_type != "Compute":
            continue
        group = g.InstanceGroupName.lower()
        mine = sorted(n for n in set(nodes) if group_prefix(n) == group)
        checks = list(g.OnStartDeepHealthChecks)
        peers: list[str] = []
        if len(mine) == 1 and "InstanceConnectivity" in checks:
            # with none, the check fails saying it needs two nodes: the node stays drained, visibly
            peers = [n for n in usable if group_prefix(n) == group and n not in mine][:1]
        if mine:
            out.append((g.InstanceGroupName, checks, mine, peers))
    return out


def check_new_nodes(cluster: Cluster, nodes: list[str], opts: Options | None = None) -> dict[str, Outcome]:
    """Check the new nodes; returns node -> verdict (Passed..., Failed: ..., Skipped: ...).
    Raises ClusterBusy (nothing done) while another request is active."""
    rec = Records(cluster.store)
    verdicts: dict[str, Outcome] = {}
    for group, checks, ns, peers in plan(cluster, nodes):
        if (act := rec.active(cluster.name)) is not None:
            reap_dead(cluster.env, rec, act)
        rid = rec.new_request(cluster.name, checks, [group], ns, {"on_start": True})
        if rid is None:
            act = rec.active(cluster.name)
            raise ClusterBusy(
                f"cluster {cluster.name} already has an active health check "
                f"{act.id if act else ''}; on-start checks of {', '.join(ns)} wait for it"
            )
        rec.set_pid(rid, os.getpid())  # if this process dies mid-check, status reports the request Failed
        o = (
            Options(checks=checks, on_start=True)
            if opts is None
            else Options(**{**opts.__dict__, "checks": checks, "on_start": True})
        )
        verdicts.update(run_and_record(cluster, rid, ns, o, peers))
    return verdicts
