"""`hp operations NAME` and `hp operations describe NAME ID` (HyperPod's
ListClusterOperations / DescribeClusterOperation): what was asked of a cluster and how it
went, from the store's records (state/operations.py) and the cluster's node phases; no
look at Docker or Slurm."""

from __future__ import annotations

from typing import Any

from ..core.context import Env
from ..core.procs import alive
from ..errors import NotFound
from ..naming import group_prefix
from ..spec.model import ClusterSpec
from ..state.operations import Operation
from ..state.phases import Phase
from ..state.store import Latest, iso


def list_operations(env: Env, name: str) -> dict[str, Any]:
    _exists(env, name)
    env.store.end_orphaned_operations(name, alive)  # what users see is true also with no agent
    return {"ClusterName": name, "Operations": [summary(op) for op in env.store.operations(name, active_only=False)]}


def describe_operation(env: Env, name: str, op_id: int) -> dict[str, Any]:
    _exists(env, name)
    env.store.end_orphaned_operations(name, alive)
    op = env.store.operation(name, op_id)
    if op is None:
        raise NotFound(f"cluster {name!r} has no operation {op_id} (see 'hp operations {name}')")
    spec = env.cluster(name).spec
    latest = env.store.latest_phases(name)
    return {
        **summary(op),
        "Nodes": list(op.nodes),
        "InstanceGroups": [counts(op, spec, latest, g) for g in groups(op, spec)],
        "Events": [e.as_dict() for e in env.store.operation_events(name, op.id)],
    }


def summary(op: Operation) -> dict[str, Any]:
    return {
        "OperationId": op.id,
        "OperationType": op.kind.value,
        "Status": op.status.value,
        "InstanceGroupName": op.group or None,
        "StartTime": iso(op.started),
        "EndTime": iso(op.ended) if op.ended is not None else None,
        "Message": op.message or None,
    }


def groups(op: Operation, spec: ClusterSpec) -> list[str]:
    """The instance groups an operation concerns: its own, its nodes', or (the cluster's
    own, an upgrade) every group of nodes."""
    if op.group:
        return [op.group]
    of_nodes = {group_prefix(n) for n in op.nodes}
    return [
        g.InstanceGroupName
        for g in spec.InstanceGroups
        if g.node_type != "Controller" and (not op.nodes or g.InstanceGroupName.lower() in of_nodes)
    ]


def counts(op: Operation, spec: ClusterSpec, latest: Latest, group: str) -> dict[str, Any]:
    """A group's counts: CurrentCount its nodes Running now, MinCount and TargetCount the
    spec's (TargetCount the one the operation set, for a count-changing one)."""
    g = spec.group(group)
    running = sum(1 for n, r in latest.items() if r.phase is Phase.RUNNING and group_prefix(n) == group.lower())
    return {
        "InstanceGroupName": group,
        "CurrentCount": running,
        "MinCount": g.MinCount if g is not None else None,
        "TargetCount": op.target if op.kind.changes_count else (g.InstanceCount if g is not None else None),
        "PreviousCount": op.previous if op.kind.changes_count else None,
    }


def _exists(env: Env, name: str) -> None:
    if env.store.cluster(name) is None:
        raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
