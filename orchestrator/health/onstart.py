"""On-start deep health checks: new nodes of a group with OnStartDeepHealthChecks are
checked before they take jobs. The provisioning code calls check_new_nodes(cluster,
nodes) once the new nodes are registered in Slurm; it runs the request in this
process (so create/scale report the outcome) and drains the nodes first.

NOT YET DONE: making the nodes register drained. Until the provisioning code does that
(see docs/health.md), a new node is idle between registering and the drain here."""
from __future__ import annotations

from ..cluster import Cluster
from .engine import Options, run_request
from .records import Records


def check_new_nodes(cluster: Cluster, nodes: list[str]) -> None:
    by_group: dict[str, list[str]] = {}
    for g in cluster.spec.InstanceGroups:
        if not g.OnStartDeepHealthChecks:
            continue
        mine = [n for n in nodes if n.rsplit("-", 1)[0] == g.InstanceGroupName.lower()]
        if mine:
            by_group.setdefault("+".join(g.OnStartDeepHealthChecks), []).extend(mine)
    if not by_group:
        return
    cluster.slurm.update([n for ns in by_group.values() for n in ns], "drain", "hp-health:on-start:pending")
    rec = Records(cluster.store)
    for checks, ns in by_group.items():
        clist = checks.split("+")
        if "InstanceConnectivity" in clist and len(ns) < 2:
            clist = [c for c in clist if c != "InstanceConnectivity"]  # one new node: no peer under check
        rid = rec.new_request(cluster.name, clist, [], ns, {"on_start": True})
        if rid is None:
            raise RuntimeError(f"cluster {cluster.name} already has an active health check")
        rec.set_state(rid, "Running")
        verdicts = run_request(cluster, rid, ns, Options(checks=clist))
        bad = {n: v for n, v in verdicts.items() if not v.startswith("Passed")}
        rec.set_state(rid, "Completed", f"{len(verdicts) - len(bad)} of {len(verdicts)} node(s) passed", ended=True)
