"""Scaling requests: they change the desired state in SQLite and wake the agent, and
return at once. The agent does the work, group by group, concurrently."""
from __future__ import annotations

from typing import Any

from .agent import ensure_agent, poke
from .cluster import Cluster, Env
from .errors import BadInput, NotFound
from .naming import L_GROUP, L_NODE


def _cluster(env: Env, name: str) -> Cluster:
    row = env.store.cluster(name)
    if row is None:
        raise NotFound(f"cluster {name!r} does not exist")
    if row.status not in ("InService", "Creating", "Updating"):
        raise BadInput(f"cluster {name!r} is {row.status}: it cannot be scaled")
    return Cluster(env, name)


def scale(env: Env, name: str, group: str, count: int, *, add: bool = False) -> dict[str, Any]:
    """Set a group's target count (or add `count` nodes to it)."""
    c = _cluster(env, name)
    problems = []
    g = c.spec.group(group)
    if g is None:
        problems.append(f"cluster {name!r} has no instance group {group!r} "
                        f"(groups: {', '.join(x.InstanceGroupName for x in c.spec.InstanceGroups)})")
    if add and count <= 0:
        problems.append(f"the number of nodes to add must be positive, got {count}")
    if not add and count < 0:
        problems.append(f"the count must be >= 0, got {count}")
    if g is not None and g.node_type == "Controller":
        problems.append(f"group {group!r} is the Controller group: it has exactly 1 instance")
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
    op = env.store.add_operation(name, group, "Scale", target, prev["n"])
    env.store.event(name, "InstanceGroup", "Info", f"Scaling instance group {group} in cluster {name} "
                    f"from {prev['n']} to {target}", group)
    ensure_agent(env, name)
    poke(env, name)
    return {"ClusterName": name, "InstanceGroupName": group, "PreviousCount": prev["n"], "TargetCount": target,
            "OperationId": op}


def delete_nodes(env: Env, name: str, nodes: list[str]) -> dict[str, Any]:
    """Remove chosen nodes: the group's target drops by as many, and those nodes (not
    others) are drained, deleted from Slurm, then removed."""
    c = _cluster(env, name)
    existing = {ci.labels[L_NODE]: ci for ci in c.p.containers(name) if L_NODE in ci.labels}
    by_id = {ci.id[:12]: n for n, ci in existing.items()}
    from .naming import node_id

    by_id.update({node_id(ci.id): n for n, ci in existing.items()})
    latest = env.store.latest_node_status(name)
    problems, chosen = [], {}
    for n in nodes:
        real = n if n in existing else by_id.get(n)
        if real is None:
            problems.append(f"cluster {name!r} has no node {n!r}")
            continue
        role = existing[real].labels.get("io.hp.role")
        if role == "controller":
            problems.append(f"{real} is the controller: it cannot be deleted")
            continue
        phase = latest.get(real, ("", "", 0.0))[0]
        if phase in ("ShuttingDown", "Removed"):
            problems.append(f"{real} is already being removed")
            continue
        if phase in ("DeepHealthCheckInProgress", "Rebooting", "Replacing"):
            problems.append(f"{real} is {phase} (a health check or recovery owns it now); try again when it is Running")
            continue
        chosen[real] = existing[real].labels[L_GROUP]
    if problems:
        raise BadInput(problems, "cannot delete nodes")
    per_group: dict[str, list[str]] = {}
    for n, g in chosen.items():
        per_group.setdefault(g, []).append(n)

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        for ig in spec["InstanceGroups"]:
            k = len(per_group.get(ig["InstanceGroupName"], []))
            if k:
                ig["InstanceCount"] = max(ig["InstanceCount"] - k, 0)
                if ig.get("MinCount") is not None and ig["MinCount"] > ig["InstanceCount"]:
                    ig["MinCount"] = ig["InstanceCount"]
        return spec

    # the marks and the lower target are written in one transaction: the agent then
    # removes exactly these nodes, and launches no replacement for them
    env.store.update_spec(name, change, [(n, "ShuttingDown", "delete-nodes") for n in chosen])
    for n, g in chosen.items():
        env.store.event(name, "Instance", "Info", f"Instance {n} in cluster {name} and instance group {g} "
                        "is being removed (delete-nodes)", g, node=n)
    for g, ns in per_group.items():
        env.store.add_operation(name, g, "DeleteNodes", None, None, ns)
    ensure_agent(env, name)
    poke(env, name)
    return {"ClusterName": name, "NodesToDelete": sorted(chosen)}
