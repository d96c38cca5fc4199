"""Honest status: derived from what Docker and Slurm report now, joined with hp's
recorded history (why a node is pending, what operation is on it). Pure functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..docker.views import Container
from ..naming import ROLE_BY_NODE_TYPE, group_prefix, node_id, split_node
from ..slurm.model import SlurmNode
from .phases import InstanceStatus as S
from .phases import NodePhase, visible
from .statuses import GroupStatus
from .store import Latest

if TYPE_CHECKING:
    from ..spec.model import ClusterSpec


@dataclass
class NodeView:
    node: str
    group: str
    itype: str
    role: str
    container: Container | None
    slurm: SlurmNode | None
    status: str
    message: str
    host: str | None = None  # multi-host: the host it runs on (or was lost with)

    def as_dict(self) -> dict[str, Any]:
        c = self.container
        return {
            "NodeId": node_id(c.id) if c else None,
            "InstanceGroupName": self.group,
            "InstanceType": self.itype,
            "NodeRole": self.role,
            "InstanceStatus": {"Status": self.status, "Message": self.message},
            "SlurmNodeName": self.node,
            "SlurmState": self.slurm.display if self.slurm else ("n/a" if self.role != "worker" else None),
            "SlurmReason": (self.slurm.reason or None) if self.slurm else None,
            "ContainerName": c.name if c else None,
            "IpAddress": c.ip if c else None,
            "Host": (c.host or None) if c else self.host,
            "LaunchTime": c.created if c else None,
        }


def instance_status(
    role: str,
    container: Container | None,
    snode: SlurmNode | None,
    recorded: NodePhase | None,
    controller_up: bool,
) -> tuple[str, str]:
    """HyperPod InstanceStatus (Pending, Running, Failure, ShuttingDown,
    DeepHealthCheckInProgress, NotFound) and a message."""
    rec_status, rec_msg = (visible(recorded.phase), recorded.message) if recorded else ("", "")
    if rec_status == S.SHUTTING_DOWN and container is not None:
        return rec_status, rec_msg
    if rec_status == S.CHECKING and container is not None:
        # isolated only once Slurm shows it drained: until then it could still take a job
        if snode is not None and snode.drained:
            return rec_status, rec_msg
        if controller_up and container.running:
            return S.RUNNING, f"{rec_msg}: being drained for the check" if rec_msg else "being drained for a check"
    if container is None:
        if rec_status == S.PENDING:
            return S.PENDING, rec_msg
        return S.NOT_FOUND, rec_msg or "no container"
    if container.dead:
        return S.FAILURE, f"container exited with code {container.exit_code}" + (f"; {rec_msg}" if rec_msg else "")
    if container.state == "created":
        return S.PENDING, rec_msg or "container created, not started"
    if not container.running:
        return S.PENDING, f"container is {container.state}"
    if role != "worker":
        return S.RUNNING, ""
    if not controller_up:
        return S.RUNNING, "controller unreachable: Slurm state unknown"
    if snode is None:
        return S.PENDING, rec_msg or "waiting for slurmd to register"
    if snode.not_responding:
        return S.FAILURE, f"Slurm reports {snode.display}" + (f": {snode.reason}" if snode.reason else "")
    if snode.awaiting_onstart:
        return S.CHECKING, "waiting for its on-start deep health checks"
    if snode.failed_health_check:
        return S.FAILURE, snode.reason  # kept drained after failing a deep health check
    return S.RUNNING, snode.reason if snode.drained else ""


def node_views(
    spec: Callable[[], ClusterSpec],
    containers: dict[str, Container],
    snodes: dict[str, SlurmNode],
    recorded: Latest,
    controller_up: bool,
    lost: dict[str, tuple[str, str]] | None = None,
) -> list[NodeView]:
    """`spec`: the cluster's spec, asked for only when a node has no container (a container
    names its group, role and type in its labels; a node without one has them from its
    group in the spec). `lost`: nodes on a registered host that does not answer (node ->
    (host, why))."""
    out = []
    lost = lost or {}
    names = set(containers) | set(lost) | {n for n, r in recorded.items() if visible(r.phase) == S.PENDING}
    groups: dict[str, tuple[str, str, str]] = {}  # group name, lower case -> (its name, role, type)
    if names - set(containers):
        groups = {
            g.InstanceGroupName.lower(): (g.InstanceGroupName, ROLE_BY_NODE_TYPE[g.node_type], g.InstanceType)
            for g in spec().InstanceGroups
        }
    for n in sorted(names, key=split_node):
        c = containers.get(n)
        if c is not None:
            group, role, itype = c.group, c.role, c.itype
        else:
            gl = group_prefix(n)
            if gl not in groups:
                continue
            group, role, itype = groups[gl]
        status, msg = instance_status(role, c, snodes.get(n), recorded.get(n), controller_up)
        host = None
        if c is None and n in lost:
            host, why = lost[n]
            status, msg = S.FAILURE, f"its host {host} does not answer ({why})"
        out.append(NodeView(n, group, itype, role, c, snodes.get(n), status, msg, host))
    return out


def group_views(
    spec: ClusterSpec, nodes: list[NodeView], active_ops: dict[str, list[str]] | None = None
) -> list[dict[str, Any]]:
    out = []
    for g in spec.InstanceGroups:
        mine = [n for n in nodes if n.group == g.InstanceGroupName]
        current = sum(1 for n in mine if n.status == S.RUNNING)
        pending = sum(1 for n in mine if n.status == S.PENDING)
        failed = sum(1 for n in mine if n.status == S.FAILURE)
        target = g.InstanceCount
        minimum = g.MinCount if g.MinCount is not None else target
        if current >= target and not failed:
            status = GroupStatus.IN_SERVICE
        elif current >= minimum and current > 0:
            status = GroupStatus.DEGRADED if failed else GroupStatus.IN_SERVICE
        elif pending or current < target:
            status = GroupStatus.CREATING if not failed else GroupStatus.DEGRADED
        else:
            status = GroupStatus.FAILED
        ops = (active_ops or {}).get(g.InstanceGroupName, [])
        if ops:
            status = GroupStatus.UPDATING if current >= minimum else status
        out.append(
            {
                "InstanceGroupName": g.InstanceGroupName,
                "InstanceType": g.InstanceType,
                "NodeType": g.node_type,
                "PartitionNames": list(g.SlurmConfig.PartitionNames),
                "TargetCount": target,
                "MinCount": g.MinCount,
                "CurrentCount": current,
                "PendingCount": pending,
                "FailedCount": failed,
                "Status": status,
                "ActiveOperations": ops,
                "OnStartDeepHealthChecks": list(g.OnStartDeepHealthChecks),
            }
        )
    return out
