"""Scaling requests: they change the desired state in SQLite and wake the agent, and
return at once. The agent does the work, group by group, concurrently.

Bounds: a cluster's compute nodes never exceed its MaxNodeCount (Slurm's dynamic-node
slots, fixed when the cluster was made), and a group never asks for more nodes of a type
than the host's whole capacity pool could ever run (`capacity.ceiling`): such a request
is refused with the limit named, nothing changed.
"""

from __future__ import annotations

import time
from typing import Any

from ..core import capacity
from ..core.context import Cluster, Env
from ..core.placement import hosts_of
from ..docker.views import LOCAL_ENGINE
from ..errors import BadInput
from ..naming import node_id
from ..spec.model import SLURM_MAX_NODES
from ..state.operations import OperationKind
from ..state.phases import Owner, Phase, owner_of
from ..state.transitions import ClusterStatus

SCALABLE = (ClusterStatus.IN_SERVICE, ClusterStatus.CREATING)


def _cluster(env: Env, name: str) -> Cluster:
    c = env.cluster(name)
    row = env.store.cluster(name)
    if row is not None and row.status not in SCALABLE:
        raise BadInput(f"cluster {name!r} is {row.status}: it cannot be scaled")
    return c


def bound_problems(c: Cluster, group: str, new_count: int) -> list[str]:
    """Why `group` may not have `new_count` nodes (empty: it may)."""
    spec = c.spec
    g = spec.group(group)
    if g is None:
        return []
    problems = []
    if g.node_type == "Compute":
        others = sum(x.InstanceCount for x in spec.compute if x.InstanceGroupName != group)
        limit = spec.max_nodes
        if others + new_count > limit:
            problems.append(
                f"the cluster's compute nodes would be {others + new_count}, above its MaxNodeCount {limit} "
                f"(Slurm's dynamic-node slots, fixed when the cluster was created; "
                f"set MaxNodeCount in the spec, at most {SLURM_MAX_NODES}, to make room)"
            )
    itype = c.env.catalogue[g.InstanceType]
    pools = capacity.pools(c.p, c.store, itype.gpus > 0)[0]
    if list(pools) == [LOCAL_ENGINE]:
        ceiling, why = capacity.ceiling(itype, pools[LOCAL_ENGINE])
    else:  # a node fits on one host: the bound is the sum of each host's
        bounds = {h: capacity.ceiling(itype, pools[h]) for h in hosts_of(g, list(pools)) if h in pools}
        ceiling = sum(b[0] for b in bounds.values())
        why = ", ".join(f"{h}: {b[0]} ({b[1]})" for h, b in bounds.items()) or "no host available"
    same_type = sum(x.InstanceCount for x in spec.InstanceGroups if x.InstanceType == g.InstanceType and x is not g)
    if same_type + new_count > ceiling:
        problems.append(
            f"InsufficientCapacity: {same_type + new_count} node(s) of {itype.name} in this cluster would be more "
            f"than the {'host' if list(pools) == [''] else 'hosts'} can ever "
            f"run: {ceiling} ({why})"
        )
    return problems


def scale(env: Env, name: str, group: str, count: int, *, add: bool = False) -> dict[str, Any]:
    """Set a group's target count (or add `count` nodes to it)."""
    c = _cluster(env, name)
    problems = []
    g = c.spec.group(group)
    if g is None:
        problems.append(
            f"cluster {name!r} has no instance group {group!r} "
            f"(groups: {', '.join(x.InstanceGroupName for x in c.spec.InstanceGroups)})"
        )
    if add and count <= 0:
        problems.append(f"the number of nodes to add must be positive, got {count}")
    if not add and count < 0:
        problems.append(f"the count must be >= 0, got {count}")
    if g is not None and g.node_type == "Controller":
        problems.append(f"group {group!r} is the Controller group: it has exactly 1 instance")
    if g is not None and not problems:
        problems += bound_problems(c, group, g.InstanceCount + count if add else count)
    if problems:
        raise BadInput(problems, "cannot scale")
    assert g is not None
    prev: dict[str, int] = {}

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        for ig in spec["InstanceGroups"]:
            if ig["InstanceGroupName"] == group:
                prev["n"] = ig["InstanceCount"]
                ig["InstanceCount"] = ig["InstanceCount"] + count if add else count
                if ig.get("MinCount") is not None and ig["MinCount"] > ig["InstanceCount"]:
                    ig["MinCount"] = ig["InstanceCount"]
        return spec

    new = env.store.update_spec(name, change)
    target = next(ig["InstanceCount"] for ig in new["InstanceGroups"] if ig["InstanceGroupName"] == group)
    kind = OperationKind.ADD_NODES if add else OperationKind.SCALE
    op = env.store.add_operation(name, group, kind, target, prev["n"])
    env.store.event(
        name,
        "InstanceGroup",
        "Info",
        f"Scaling instance group {group} in cluster {name} from {prev['n']} to {target}",
        group,
    )
    env.agents.ensure(name)
    env.agents.poke(name)
    return {
        "ClusterName": name,
        "InstanceGroupName": group,
        "PreviousCount": prev["n"],
        "TargetCount": target,
        "OperationId": op,
    }


def delete_nodes(env: Env, name: str, nodes: list[str]) -> dict[str, Any]:
    """Remove chosen nodes: the group's target drops by as many, and those nodes (not
    others) are drained, deleted from Slurm, then removed."""
    c = _cluster(env, name)
    existing = c.node_containers()
    by_id = {ci.id[:12]: n for n, ci in existing.items()}
    by_id.update({node_id(ci.id): n for n, ci in existing.items()})
    latest = env.store.latest_phases(name)
    now = time.time()
    problems, chosen = [], {}
    for n in dict.fromkeys(nodes):
        real = n if n in existing else by_id.get(n)
        if real is None:
            problems.append(f"cluster {name!r} has no node {n!r}")
            continue
        if existing[real].role == "controller":
            problems.append(f"{real} is the controller: it cannot be deleted")
            continue
        phase = latest.phase(real)
        if phase in (Phase.SHUTTING_DOWN, Phase.REMOVED):
            problems.append(f"{real} is already being removed")
            continue
        if owner_of(latest.get(real), now) in (Owner.HEALTH, Owner.RECOVERY):
            problems.append(f"{real} is {phase} (a health check or recovery owns it now); try again when it is Running")
            continue
        chosen[real] = existing[real].group
    if problems:
        raise BadInput(problems, "cannot delete nodes")
    per_group: dict[str, list[str]] = {}
    for n, g in chosen.items():
        per_group.setdefault(g, []).append(n)

    before: dict[str, int] = {}

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        for ig in spec["InstanceGroups"]:
            k = len(per_group.get(ig["InstanceGroupName"], []))
            if k:
                before[ig["InstanceGroupName"]] = ig["InstanceCount"]
                ig["InstanceCount"] = max(ig["InstanceCount"] - k, 0)
                if ig.get("MinCount") is not None and ig["MinCount"] > ig["InstanceCount"]:
                    ig["MinCount"] = ig["InstanceCount"]
        return spec

    # the marks and the lower target are written in one transaction: the agent then
    # removes exactly these nodes, and launches no replacement for them
    new = env.store.update_spec(name, change, [(n, Phase.SHUTTING_DOWN, "delete-nodes") for n in chosen])
    counts = {ig["InstanceGroupName"]: ig["InstanceCount"] for ig in new["InstanceGroups"]}
    ops = {
        g: env.store.add_operation(name, g, OperationKind.DELETE_NODES, counts[g], before[g], ns)
        for g, ns in per_group.items()
    }
    for n, g in chosen.items():
        env.store.event(
            name,
            "Instance",
            "Info",
            f"Instance {n} in cluster {name} and instance group {g} is being removed (delete-nodes)",
            g,
            node=n,
        )
    env.agents.ensure(name)
    env.agents.poke(name)
    return {"ClusterName": name, "NodesToDelete": sorted(chosen), "OperationIds": sorted(ops.values())}
