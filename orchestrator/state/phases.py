"""The per-node state machine, as data (Ray autoscaler v2 style): the phases, the
transition table with terminal phases marked, who owns a node in each phase and for how
long, and the history from which retry counts and timeouts are derived.

`check(frm, to)` is the gate: every phase change goes through `Store.set_phase` (or the
same gate inside `Store.update_spec`), which calls it and raises InvalidTransition for
an edge the table does not list or a phase that is not a Phase.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum, StrEnum

from ..errors import InvalidTransition
from ..waits import slept_after


class Phase(StrEnum):
    QUEUED = "Queued"  # wanted, no container: waiting for capacity or for its retry
    LAUNCHING = "Launching"  # container created/started, slurmd not registered yet
    RUNNING = "Running"  # registered in Slurm (or answering, for controller and login nodes)
    LAUNCH_FAILED = "LaunchFailed"  # the last try failed (reason in the message); retried after backoff
    CHECKING = "DeepHealthCheckInProgress"  # drained and checked by a deep health check
    REBOOTING = "Rebooting"
    REPLACING = "Replacing"
    SHUTTING_DOWN = "ShuttingDown"  # draining, then removed from Slurm, then its container
    REMOVED = "Removed"  # gone on purpose (scale-down, delete-nodes): terminal


@dataclass(frozen=True, slots=True)
class NodePhase:
    """One recorded phase of a node: what the store hands back (Store.latest_phases,
    Store.node_history), never a raw string."""

    phase: Phase
    message: str
    time: float


class Phases(dict[str, NodePhase]):
    """node -> its latest recorded phase (Store.latest_phases)."""

    def phase(self, node: str) -> Phase | None:
        """The node's latest phase; None when it has no history."""
        rec = self.get(node)
        return rec.phase if rec is not None else None


P = Phase


class InstanceStatus(StrEnum):
    """What `hp nodes` shows of a node (HyperPod's InstanceStatus): derived from its
    phase and what Docker and Slurm report now (state/status.py)."""

    PENDING = "Pending"
    RUNNING = "Running"
    FAILURE = "Failure"
    CHECKING = "DeepHealthCheckInProgress"
    SHUTTING_DOWN = "ShuttingDown"
    NOT_FOUND = "NotFound"


S = InstanceStatus

# phase -> HyperPod InstanceStatus shown by `hp nodes` (when Docker and Slurm add nothing)
VISIBLE: dict[Phase, InstanceStatus] = {
    P.QUEUED: S.PENDING,
    P.LAUNCHING: S.PENDING,
    P.RUNNING: S.RUNNING,
    P.LAUNCH_FAILED: S.PENDING,
    P.CHECKING: S.CHECKING,
    P.REBOOTING: S.PENDING,
    P.REPLACING: S.PENDING,
    P.SHUTTING_DOWN: S.SHUTTING_DOWN,
    P.REMOVED: S.NOT_FOUND,
}

# Terminal: the node's incarnation is over. A later scale-up that reuses the name starts
# a new one (Removed -> Queued), nothing else leaves it.
TERMINAL = frozenset({P.REMOVED})

# A node's first recorded phase: launched by the reconciler or `hp create`, or (the
# controller, which has no launch history) first seen when recovery acts on it.
INITIAL = frozenset({P.QUEUED, P.REBOOTING, P.REPLACING})

# (from, to): why the edge exists. Anything not listed is a bug, and is refused.
TRANSITIONS: dict[tuple[Phase, Phase], str] = {
    (P.QUEUED, P.QUEUED): "still waiting, for another reason",
    (P.QUEUED, P.LAUNCHING): "capacity was reserved and the container created",
    (P.QUEUED, P.LAUNCH_FAILED): "no capacity, or the engine refused the container",
    (P.QUEUED, P.REMOVED): "scaled down before it was launched",
    (P.QUEUED, P.SHUTTING_DOWN): "deleted by name while waiting",
    (P.LAUNCHING, P.RUNNING): "slurmd registered and the node is usable",
    (P.LAUNCHING, P.LAUNCH_FAILED): "the container exited at start, or slurmd did not register in time",
    (P.LAUNCHING, P.SHUTTING_DOWN): "scaled down while launching",
    (P.LAUNCHING, P.REBOOTING): "an admin asked (hp reboot) while it was launching",
    (P.LAUNCHING, P.REPLACING): "an admin asked (hp replace) while it was launching",
    (P.LAUNCHING, P.QUEUED): "its container vanished before slurmd registered: launched again",
    (P.LAUNCH_FAILED, P.QUEUED): "its backoff has passed: try again",
    (P.LAUNCH_FAILED, P.LAUNCHING): "retried at once (a container that already exists was started)",
    (P.LAUNCH_FAILED, P.REMOVED): "scaled down while waiting to retry",
    (P.LAUNCH_FAILED, P.LAUNCH_FAILED): "failed again, for the same or another reason",
    (P.LAUNCH_FAILED, P.SHUTTING_DOWN): "deleted by name while waiting to retry",
    (P.LAUNCH_FAILED, P.REPLACING): "an admin asked (hp replace)",
    (P.RUNNING, P.RUNNING): "still running; the message changed (e.g. kept drained after a failed check)",
    (P.RUNNING, P.CHECKING): "a deep health check drained it",
    (P.RUNNING, P.REBOOTING): "its container died, slurmd stopped answering, or an admin asked",
    (P.RUNNING, P.REPLACING): "a reboot did not help, or an admin asked",
    (P.RUNNING, P.SHUTTING_DOWN): "scaled down or deleted by name",
    (P.RUNNING, P.QUEUED): "its container vanished and recovery is off: the reconciler launches it again",
    (P.RUNNING, P.LAUNCHING): "its container was recreated by someone else (e.g. docker start): waiting for slurmd",
    (P.CHECKING, P.RUNNING): "passed (resumed), or kept drained with the reason it failed",
    (P.CHECKING, P.REBOOTING): "failed with NodeRecovery Automatic",
    (P.CHECKING, P.REPLACING): "failed again after a reboot",
    (P.REBOOTING, P.RUNNING): "back and registered",
    (P.REBOOTING, P.REPLACING): "the reboot did not bring it back",
    (P.REBOOTING, P.REBOOTING): "a reboot whose process died is tried again",
    (P.REBOOTING, P.CHECKING): "rebooted after a failed check: checked again",
    (P.REBOOTING, P.LAUNCH_FAILED): "the reboot did not bring it back and recovery gave up: the reconciler retries",
    (P.REBOOTING, P.QUEUED): "a reboot whose process died left no container: the reconciler launches it",
    (P.REPLACING, P.RUNNING): "the new container registered under the same name",
    (P.REPLACING, P.CHECKING): "a replacement is checked before it takes jobs",
    (P.REPLACING, P.LAUNCH_FAILED): "the replacement could not be launched: the reconciler retries",
    (P.REPLACING, P.REPLACING): "a replacement whose process died is tried again",
    (P.REPLACING, P.REBOOTING): "a replacement that failed part-way (engine down) is recovered again: reboot first",
    (P.REPLACING, P.QUEUED): "a replacement whose process died left no container: the reconciler launches it",
    (P.SHUTTING_DOWN, P.REMOVED): "removed from Slurm, then its container",
    (P.REMOVED, P.QUEUED): "scaled up again: the name is reused by a new incarnation",
}


class Owner(str, Enum):
    """Who acts on a node in a phase; the others leave it alone."""

    RECONCILER = "reconciler"  # launching and retrying (the agent's provisioning)
    RECOVERY = "recovery"  # a reboot or replacement under way
    HEALTH = "health"  # a deep health check holds it
    REMOVAL = "removal"  # being removed
    NONE = "none"  # running (the recovery watcher's to watch), or gone


OWNER: dict[Phase, Owner] = {
    P.QUEUED: Owner.RECONCILER,
    P.LAUNCHING: Owner.RECONCILER,
    P.LAUNCH_FAILED: Owner.RECONCILER,
    P.RUNNING: Owner.NONE,
    P.CHECKING: Owner.HEALTH,
    P.REBOOTING: Owner.RECOVERY,
    P.REPLACING: Owner.RECOVERY,
    P.SHUTTING_DOWN: Owner.REMOVAL,
    P.REMOVED: Owner.NONE,
}

# How long an owner keeps a node without a new record before others may take it back:
# a recovery whose process died leaves the node Rebooting/Replacing; after this long the
# watcher may act again and the reconciler may count it as missing. (A reboot waits at
# most 90 s for the node by default; a replacement as long.) Health checks own their
# nodes while their request is active (their worker's liveness is checked instead).
RECOVERY_OWNERSHIP_S = 180.0


def parse(phase: str | Phase | None) -> Phase | None:
    """A recorded phase as a Phase (None: no history). An unknown name is a bug."""
    if phase is None or isinstance(phase, Phase):
        return phase
    try:
        return Phase(phase)
    except ValueError:
        raise InvalidTransition(f"unknown node phase {phase!r}") from None


def allowed(frm: Phase | str | None, to: Phase | str) -> bool:
    try:
        f, t = parse(frm), parse(to)
    except InvalidTransition:
        return False
    if t is None:
        return False
    if f is None:
        return t in INITIAL
    return (f, t) in TRANSITIONS


def check(node: str, frm: Phase | str | None, to: Phase | str) -> Phase:
    """The gate: the new phase, or InvalidTransition for an edge the table refuses."""
    t = parse(to)
    if t is None or not allowed(frm, t):
        raise InvalidTransition(f"node {node}: {frm or '(no history)'} -> {to} is not an allowed phase change")
    return t


def visible(phase: Phase | str) -> InstanceStatus | str:
    p = parse(phase)
    return VISIBLE[p] if p is not None else str(phase)


def owner_of(rec: NodePhase | None, now: float) -> Owner:
    """Who owns a node whose latest record is `rec` (None: no history, nobody)."""
    return owner(rec.phase, rec.time, now) if rec is not None else Owner.NONE


def owner(phase: Phase | str | None, since: float | None, now: float) -> Owner:
    """Who owns a node recorded in `phase` since `since` (a recovery stops owning it
    after RECOVERY_OWNERSHIP_S without a new record)."""
    p = parse(phase)
    if p is None:
        return Owner.NONE
    o = OWNER[p]
    if o is Owner.RECOVERY and since is not None and now - since >= RECOVERY_OWNERSHIP_S:
        return Owner.NONE
    return o


@dataclass(frozen=True)
class History:
    """A node's status history, oldest first (Store.node_history)."""

    rows: list[NodePhase]

    @property
    def phase(self) -> Phase | None:
        return self.rows[-1].phase if self.rows else None

    @property
    def message(self) -> str:
        return self.rows[-1].message if self.rows else ""

    @property
    def since(self) -> float | None:
        return self.rows[-1].time if self.rows else None

    def failures_since_running(self) -> int:
        """Consecutive failed launches since the node last ran: the retry count."""
        n = 0
        for rec in reversed(self.rows):
            if rec.phase is P.RUNNING:
                break
            if rec.phase is P.LAUNCH_FAILED:
                n += 1
        return n

    def try_number(self) -> int:
        """The number of the launch under way (or that just failed, before it is written):
        1 for a node's first launch since it last ran."""
        return self.failures_since_running() + 1

    def next_retry(self, backoff: Backoff) -> float | None:
        """When a failed launch may be tried again (None: not waiting for a retry)."""
        if self.phase is not P.LAUNCH_FAILED or self.since is None:
            return None
        return self.since + backoff.delay(self.failures_since_running())

    def retry_due(self, now: float, backoff: Backoff) -> bool:
        nxt = self.next_retry(backoff)
        return nxt is None or now >= nxt


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff, computed with tenacity's wait strategy from the retry count."""

    initial: float = 1.0
    maximum: float = 10.0

    def delay(self, attempt: int) -> float:
        from tenacity import wait_exponential  # here: the commands that read phases compute no backoff

        # 2**31 times the first wait is past any maximum: later tries wait the same
        wait = wait_exponential(multiplier=self.initial, min=self.initial, max=self.maximum)
        return float(slept_after(wait, min(max(attempt, 1), 32)))


def now() -> float:
    return time.time()
