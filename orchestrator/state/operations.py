"""A cluster's operations (HyperPod's ListClusterOperations / DescribeClusterOperation):
each scale, add or delete of nodes, deep health check, reboot or replace by hand and
software upgrade is one, with a kind, a status and the events written while it ran.
Recorded by state/store.py (`add_operation`, `end_operation`, `operations`,
`operation`); this module holds their words and their typed record, and the one rule of
which operation an event or a newer request concerns.

- A newer count-changing operation (scale, add or delete of nodes) of a group supersedes
  the group's older ones still in progress (`supersedes`), as HyperPod's does.
- An event belongs to the operation in progress that names its node, else to the
  count-changing one of its group, else to the cluster's own (an upgrade): `owner`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class OperationKind(StrEnum):
    SCALE = "Scale"
    ADD_NODES = "AddNodes"
    DELETE_NODES = "DeleteNodes"
    HEALTH_CHECK = "HealthCheck"
    REBOOT = "Reboot"
    REPLACE = "Replace"
    UPGRADE = "Upgrade"

    @property
    def changes_count(self) -> bool:
        """Sets a group's target count: a newer one of the group supersedes it."""
        return self in COUNT_KINDS


COUNT_KINDS = frozenset({OperationKind.SCALE, OperationKind.ADD_NODES, OperationKind.DELETE_NODES})
# what all-or-nothing provisioning rolls back to the previous count when a node fails to launch
ROLLS_BACK = frozenset({OperationKind.SCALE, OperationKind.ADD_NODES})


LEGACY_DONE = ("Succeeded", "Successful")  # the words rows were ended with before OperationStatus


class OperationStatus(StrEnum):
    IN_PROGRESS = "InProgress"
    SUPERSEDED = "Superseded"  # a newer request for the same group took its place
    DONE = "Done"
    FAILED = "Failed"

    @classmethod
    def _missing_(cls, value: object) -> OperationStatus | None:
        # read back from rows of before this enum, and still accepted from callers
        return cls.DONE if value in LEGACY_DONE else None


@dataclass(frozen=True)
class Operation:
    id: int
    cluster: str
    group: str  # "" for the cluster's own (an upgrade) or one spanning several groups
    kind: OperationKind
    status: OperationStatus
    target: int | None  # the group's target count it set (count-changing kinds)
    previous: int | None  # the group's count before it
    nodes: tuple[str, ...]  # the nodes it acts on (delete-nodes, health check, reboot, replace)
    message: str
    started: float
    ended: float | None
    request: str = ""  # what else records it: a health check's request id
    pid: int | None = None  # the process doing it, when a command does it itself (hp reboot, hp replace)

    @property
    def active(self) -> bool:
        return self.status == OperationStatus.IN_PROGRESS


def supersedes(new: Operation, old: Operation) -> bool:
    """Does `new` take `old`'s place (HyperPod: a newer update of the same group)?"""
    return (
        old.active
        and old.id != new.id
        and old.cluster == new.cluster
        and new.kind.changes_count
        and old.kind.changes_count
        and old.group == new.group
    )


def owner(active: Iterable[Operation], group: str | None, node: str | None) -> int | None:
    """The id of the operation in progress an event of `group`/`node` belongs to (the
    newest of each rank), or None."""
    ops = sorted((o for o in active if o.active), key=lambda o: -o.id)
    for fits in (
        lambda o: bool(node) and node in o.nodes,
        lambda o: bool(group) and o.group == group and o.kind.changes_count,
        lambda o: o.group == "" and o.kind == OperationKind.UPGRADE,
    ):
        found = next((o.id for o in ops if fits(o)), None)
        if found is not None:
            return found
    return None
