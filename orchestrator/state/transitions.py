"""The cluster's status and a health-check request's state, as data (like the node phases
in phases.py): each an enum and a transition table listing every allowed edge, why it
exists and the event a change along it writes.

One writer each: `Store.set_status` (and `Store.add_cluster`, the first status) for a
cluster, `Records.set_state` (and `Records.new_request`) in health_requests.py for a
request. The writer calls `edge()` in the write transaction that records the change, so
an edge the table does not list (or a name that is not a member) raises
InvalidTransition and nothing is written; the edge's event goes in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from ..errors import InvalidTransition
from .statuses import ClusterStatus, RequestState

S = ClusterStatus
R = RequestState
State = TypeVar("State", ClusterStatus, RequestState)


@dataclass(frozen=True)
class Edge:
    """An allowed change: why it exists, and the event it writes (level None: none).
    The text's fields: {name} (the cluster, or the request's id), {message} (the status
    message recorded with it), {detail} (what the writer's caller adds, event only)."""

    why: str
    level: str | None = None
    text: str = ""

    def event(self, name: str, message: str = "", detail: str = "") -> str:
        return self.text.format(name=name, message=message, detail=detail)


# (from, to): the edge. None as `from`: the first status, written when the cluster is recorded.
CLUSTER: dict[tuple[ClusterStatus | None, ClusterStatus], Edge] = {
    (None, S.CREATING): Edge("hp create recorded it", "Info", "Cluster {name} creation started ({detail})"),
    (S.CREATING, S.IN_SERVICE): Edge(
        "its controller (and, all-or-nothing, every node) came up", "Info", "Cluster {name} is InService"
    ),
    (S.CREATING, S.ROLLING_BACK): Edge(
        "its creation failed: what was made is removed",
        "Error",
        "Cluster {name} creation failed, rolling back: {message}",
    ),
    (S.CREATING, S.FAILED): Edge(
        "its creation failed and --retain keeps what was made",
        "Error",
        "Cluster {name} creation failed (kept with --retain): {message}",
    ),
    (S.ROLLING_BACK, S.FAILED): Edge(
        "the rollback removed everything", "Info", "Cluster {name} rolled back: no container, network or volume is left"
    ),
    (S.IN_SERVICE, S.DEGRADED): Edge("its controller's host does not answer", "Error", "Cluster {name}: {message}"),
    (S.DEGRADED, S.DEGRADED): Edge(
        "its controller's host was lost again before it was back", "Error", "Cluster {name}: {message}"
    ),
    (S.DEGRADED, S.IN_SERVICE): Edge(
        "its controller's host is back", "Info", "Cluster {name} is InService again: {detail}"
    ),
    **{
        (frm, S.DELETING): Edge(f"hp delete of a cluster {frm}", "Info", "Cluster {name} deletion started")
        for frm in (S.CREATING, S.IN_SERVICE, S.FAILED, S.DEGRADED, S.ROLLING_BACK)
    },
    (S.DELETING, S.DELETING): Edge(
        "hp delete again (an earlier one was interrupted)", "Info", "Cluster {name} deletion started"
    ),
}

# A cluster being removed (or kept as it failed): its agent exits, its services are left alone
ENDING = (S.DELETING, S.ROLLING_BACK, S.FAILED)
# ... and one being created: its nodes are create's, recovery and the host watch leave them alone
NODES_HANDS_OFF = (S.CREATING, *ENDING)

REQUEST: dict[tuple[RequestState | None, RequestState], Edge] = {
    # {detail}: what was requested, said by the writer from the request (health_requests.requested)
    (None, R.PENDING): Edge(
        "hp health-check start, or new nodes with on-start checks", "Info", "Deep health check {name} {detail}"
    ),
    (R.PENDING, R.RUNNING): Edge("its worker (or the agent) started it; the request's event said so"),
    (R.PENDING, R.FAILED): Edge(
        "its worker died before it ran, or its recorded options are invalid",
        "Error",
        "Deep health check {name} failed: {message}",
    ),
    (R.PENDING, R.CANCELLED): Edge("cancelled before it ran", "Info", "Deep health check {name}: {message}"),
    (R.RUNNING, R.COMPLETED): Edge(
        "every node has its verdict", "Info", "Deep health check {name} completed: {message}{detail}"
    ),
    (R.RUNNING, R.FAILED): Edge(
        "its worker died, or the request hit an error", "Error", "Deep health check {name} failed: {message}"
    ),
    (R.RUNNING, R.CANCELLED): Edge("hp health-check cancel", "Info", "Deep health check {name}: {message}"),
}

ACTIVE = frozenset({R.PENDING, R.RUNNING})  # a cluster has at most one active request


def edge(
    table: dict[tuple[State | None, State], Edge], kind: type[State], what: str, frm: str | None, to: str
) -> tuple[State, Edge]:
    """The gate: (the new state, its edge), or InvalidTransition for an edge `table`
    does not list or a name that is not a `kind`."""
    try:
        f, t = (kind(frm) if frm is not None else None), kind(to)
    except ValueError:
        raise InvalidTransition(f"{what}: unknown {kind.__name__} in {frm!r} -> {to!r}") from None
    e = table.get((f, t))
    if e is None:
        raise InvalidTransition(f"{what}: {f or '(none)'} -> {t} is not an allowed {kind.__name__} change")
    return t, e


def expected(current: str, expect: Enum | Iterable[Enum] | None) -> bool:
    """Is the recorded value `current` what a writer's caller expects (None: anything)?"""
    if expect is None:
        return True
    return current in ({expect.value} if isinstance(expect, Enum) else {e.value for e in expect})


def cluster_edge(name: str, frm: str | None, to: str) -> tuple[ClusterStatus, Edge]:
    return edge(CLUSTER, ClusterStatus, f"cluster {name}", frm, to)


def request_edge(rid: str, frm: str | None, to: str) -> tuple[RequestState, Edge]:
    return edge(REQUEST, RequestState, f"health check {rid}", frm, to)
