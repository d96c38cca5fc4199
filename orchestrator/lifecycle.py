"""The per-node state machine, as a literal transition table (Ray autoscaler v2 style).

Phases are recorded in the node_status history with a timestamp; retry counts and
timeouts are derived from that history, never kept in memory. The status a user sees
(HyperPod's InstanceStatus) is a function of the phase.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

# phase -> HyperPod InstanceStatus shown by `hp nodes`
VISIBLE = {
    "Queued": "Pending",  # wanted, no container: waiting for capacity or for its retry
    "Launching": "Pending",  # container created/started, slurmd not registered yet
    "Running": "Running",  # registered in Slurm
    "LaunchFailed": "Pending",  # the last try failed (reason in the message); retried after backoff
    "DeepHealthCheckInProgress": "DeepHealthCheckInProgress",
    "Rebooting": "Pending",
    "Replacing": "Pending",
    "ShuttingDown": "ShuttingDown",  # draining, then removed from Slurm, then its container
    "Removed": "NotFound",  # gone on purpose (scale-down, delete-nodes)
}


# (from, to): why the edge exists. Anything not listed is a bug, and is refused.
TRANSITIONS: dict[tuple[str, str], str] = {
    ("Queued", "Launching"): "capacity was reserved and the container created",
    ("Queued", "LaunchFailed"): "no capacity, or the engine refused the container",
    ("Queued", "Removed"): "scaled down before it was launched",
    ("Launching", "Running"): "slurmd registered and the node is usable",
    ("Launching", "LaunchFailed"): "the container exited at start, or slurmd did not register in time",
    ("Launching", "ShuttingDown"): "scaled down while launching",
    ("LaunchFailed", "Queued"): "its backoff has passed: try again",
    ("LaunchFailed", "Launching"): "retried at once (a container that already exists was started)",
    ("LaunchFailed", "Removed"): "scaled down while waiting to retry",
    ("LaunchFailed", "LaunchFailed"): "failed again, for the same or another reason",
    ("Running", "DeepHealthCheckInProgress"): "a deep health check drained it",
    ("Running", "Rebooting"): "its container died, slurmd stopped answering, or an admin asked",
    ("Running", "Replacing"): "a reboot did not help, or an admin asked",
    ("Running", "ShuttingDown"): "scaled down or deleted by name",
    ("Running", "LaunchFailed"): "its container vanished and recovery is off: relaunched by the reconciler",
    ("Running", "Queued"): "its container vanished and recovery is off: the reconciler launches it again",
    ("Running", "Launching"): "its container was recreated by someone else (e.g. docker start): waiting for slurmd",
    ("DeepHealthCheckInProgress", "Running"): "passed: resumed",
    ("DeepHealthCheckInProgress", "Rebooting"): "failed with NodeRecovery Automatic",
    ("DeepHealthCheckInProgress", "Replacing"): "failed again after a reboot",
    ("Rebooting", "Running"): "back and registered",
    ("Rebooting", "Replacing"): "the reboot did not bring it back",
    ("Rebooting", "DeepHealthCheckInProgress"): "rebooted after a failed check: checked again",
    ("Replacing", "Running"): "the new container registered under the same name",
    ("Replacing", "DeepHealthCheckInProgress"): "a replacement is checked before it takes jobs",
    ("Replacing", "LaunchFailed"): "the replacement could not be launched: the reconciler retries",
    ("ShuttingDown", "Removed"): "removed from Slurm, then its container",
    ("Removed", "Queued"): "scaled up again: the name is reused",
}


PHASES = set(VISIBLE)
# a node's first recorded phase: launched by the reconciler, or (controller and login
# nodes made by `hp create`, which have no history) first seen when recovery acts on it
INITIAL = {"Queued", "Launching", "Rebooting", "Replacing"}


def allowed(frm: str | None, to: str) -> bool:
    """May a node go from phase `frm` (None: no history) to `to`? Phases written by
    other writers in HyperPod's vocabulary (e.g. "Pending") are not policed here."""
    if frm is None:
        return to in INITIAL or to not in PHASES
    if frm not in PHASES or to not in PHASES:
        return True
    return (frm, to) in TRANSITIONS


def visible(phase: str) -> str:
    return VISIBLE.get(phase, phase)


@dataclass(frozen=True)
class History:
    """A node's status history, oldest first: (phase, message, time)."""

    rows: list[tuple[str, str, float]]

    @property
    def phase(self) -> str | None:
        return self.rows[-1][0] if self.rows else None

    @property
    def since(self) -> float | None:
        return self.rows[-1][2] if self.rows else None

    def failures_since_running(self) -> int:
        """Consecutive failed launches since the node last ran: the retry count."""
        n = 0
        for phase, _, _ in reversed(self.rows):
            if phase == "Running":
                break
            if phase == "LaunchFailed":
                n += 1
        return n

    def retry_due(self, now: float, backoff: "Backoff") -> bool:
        if self.phase != "LaunchFailed" or self.since is None:
            return True
        return now >= self.since + backoff.delay(self.failures_since_running())

    def next_retry(self, backoff: "Backoff") -> float | None:
        if self.phase != "LaunchFailed" or self.since is None:
            return None
        return self.since + backoff.delay(self.failures_since_running())


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff, computed with tenacity's wait strategy from the retry count."""

    initial: float = 1.0
    maximum: float = 10.0

    def delay(self, attempt: int) -> float:
        from tenacity import RetryCallState, wait_exponential

        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(attempt, 1)
        return float(wait_exponential(multiplier=self.initial, min=self.initial, max=self.maximum)(state))


def now() -> float:
    return time.time()
